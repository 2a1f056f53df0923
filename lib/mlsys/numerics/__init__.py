"""Number formats put to work: rounding, summation, fp8 scaling, loss scaling, weight updates,
normalization numerics, and the dtypes autocast really uses.

Teaching modules of chapters 01 and 07; each is a function of numbers and tensors, no model.
"""
