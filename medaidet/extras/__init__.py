"""What only notebooks 07-09 and the command line import, never the core (:mod:`.mpi`)."""
