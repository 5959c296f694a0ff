"""Training (notebooks 03 and 06): the course recipe, its run, seeding and resume."""
