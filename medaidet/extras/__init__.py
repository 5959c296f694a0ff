"""What only notebooks 07-09 and the command line use, never the core: for now the ranks of
a multi-process run (:mod:`medaidet.extras.mpi`)."""
