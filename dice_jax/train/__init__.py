"""Training: optimizer, train state, pure jitted steps, and the SFT loop."""
