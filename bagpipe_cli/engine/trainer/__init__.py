"""The trainer step: what one trainer process does with a round's plan.

    loop         the training loop of every runtime (`TrainingLoop`)
    passes       an iteration's forward and backward passes
    staging      a round's inputs moved to the device a round ahead; the phases' clock
    cache        the trainer's row cache (`RowCache`)
    optim        the row optimizers (SGD, row-wise Adagrad)
    device       which device a trainer gets; deterministic kernels on a GPU
    evaluation   held-out AUC and log loss
    trainer_set  which of the run's trainers one process runs (`TrainerSet`)
"""
