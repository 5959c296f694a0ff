"""``python -m medaidet.scaling.mpi_probe``: which MPI library mpi4py loads, in a child.

Loads the library without calling ``MPI_Init`` (``mpi4py.rc.initialize`` off), so a broken or
missing MPI (or a crash loading it) never touches the caller, and prints one JSON line:
``{"library": MPI.Get_library_version()}``. :func:`medaidet.scaling.distributed.mpi_info`
runs it.
"""
import json

import mpi4py


def main() -> int:
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    print(json.dumps({"library": MPI.Get_library_version()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
