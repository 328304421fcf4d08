"""Where users already are: adaptive-draft's decoder behind other libraries' entry points.

:mod:`adaptive.integrations.transformers`: a draft policy inside transformers' own ``generate()``.
"""
