"""Masked-diffusion training objectives: noising, the 1/t-weighted ELBO, SDAR's two-copy objective."""
