"""Records: what a run leaves behind.

    metrics        every metrics.csv column and summary.json key; a step's record
    run_record     a finished run in types: trainer and server reports, layout, `RunRecord`
    result         a finished run's result (`TrainResult`) from its `RunRecord`
    checkpoint     checkpoints: writing, verifying, finding and resuming
    lineage        whose checkpoints a --checkpoint-dir holds
    resume_checks  what --resume checks in a checkpoint
    trace          --trace's Chrome trace-event document (`Tracer`)
    model_file     --save-model: the trained model's file
"""
