"""The detector (notebook 02): SSD built from ChainerCV, its weights, the safe multibox loss,
the train chain, the training transform and capped prediction."""
