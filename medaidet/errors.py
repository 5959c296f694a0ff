"""The one base class for every error medaidet raises on purpose.

Messages name the file, object or value at fault and say how to fix it.
"""


class MedaidetError(Exception):
    """Base class of medaidet's named errors."""


class DistributedError(MedaidetError):
    """Multi-process training (ChainerMN, ``mpiexec``) cannot run as asked.

    ``kind`` says what is wrong: ``"mpi"`` (mpi4py, the MPI library or ``mpiexec`` is
    missing), ``"communicator"`` (a name ChainerMN 7 does not accept, or a communicator
    that cannot work on this device), ``"ranks"`` (a setting that does not fit the number
    of ranks: the number itself, the batch size, the images, the GPUs per host),
    ``"launch"`` (``mpiexec`` failed, or ran past its timeout) or ``"diverged"`` (the
    ranks ended training with different parameters). A launch error also keeps ``command``
    (list), ``returncode`` (``None`` on a timeout), ``output`` (all the ranks printed) and
    ``tail`` (its last lines, also in the message); a divergence ``digests`` (the sha256 of
    each rank's parameters, by rank).
    """

    KINDS = ("mpi", "communicator", "ranks", "launch", "diverged")

    def __init__(self, message, kind, *, command=None, returncode=None, output="", tail="",
                 digests=None):
        if kind not in self.KINDS:
            raise ValueError(f"DistributedError kind {kind!r}: use one of {self.KINDS}")
        super().__init__(message)
        self.kind = kind
        self.command, self.returncode, self.output, self.tail = command, returncode, output, tail
        self.digests = digests

    def __reduce__(self):      # copied and pickled (across processes) with its fields
        return type(self), (str(self), self.kind), self.__dict__
