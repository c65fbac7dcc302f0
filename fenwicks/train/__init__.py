"""Training: optimizers, schedules, the LR finder and the estimator. (Being built.)"""
