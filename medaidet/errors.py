"""medaidet's named errors: one per boundary, each a :class:`MedaidetError`.

Messages name the file, object or value at fault and say how to fix it. ``kind``, a short
word, says which case of its boundary an error is, for code (and tests) that tell the cases
apart without reading the message; the other facts an error carries (the file, the batch,
the iteration, ...) are attributes, listed by each class.
"""
from pathlib import Path


class MedaidetError(Exception):
    """Base class of medaidet's named errors: ``message``, ``kind`` (one of the class's
    ``KINDS``; None where a class has none) and keyword arguments kept as attributes."""

    KINDS = ()

    def __init__(self, message="", kind=None, **fields):
        if not (kind is None or isinstance(kind, str)) or self.KINDS and kind not in self.KINDS:
            raise ValueError(f"{type(self).__name__} kind {kind!r}: use one of "
                             f"{self.KINDS or 'None or a word'}; other facts go by keyword")
        super().__init__(message)
        self.kind = kind
        self.__dict__.update(fields)

    def __reduce__(self):      # copied and pickled (across processes) with its fields
        return type(self), (self.args[0] if self.args else "", self.kind), self.__dict__


class DistributedError(MedaidetError):
    """Multi-process training (ChainerMN, ``mpiexec``) cannot run as asked.

    ``kind``: ``"mpi"`` (mpi4py, the MPI library or ``mpiexec`` is missing),
    ``"communicator"`` (a name ChainerMN 7 does not accept, or a communicator that cannot
    work on this device), ``"ranks"`` (a setting that does not fit the number of ranks: the
    number itself, the batch size, the images, the GPUs per host), ``"launch"``
    (``mpiexec`` failed, or ran past its timeout) or ``"diverged"`` (the ranks ended
    training with different parameters). A launch error also has ``command`` (list),
    ``returncode`` (``None`` on a timeout), ``output`` (all the ranks printed) and ``tail``
    (its last lines, also in the message); a divergence ``digests`` (the sha256 of each
    rank's parameters, by rank).
    """

    KINDS = ("mpi", "communicator", "ranks", "launch", "diverged")


class InvalidTargetsError(MedaidetError, ValueError):
    """What the loss is given disagrees in shape or dtype, or its targets hold invalid values
    (notebook 02, section 7). ``argument`` names the argument at fault; ``batch_index``,
    ``prior_index``, ``value`` (of the first bad entry), ``count`` (of bad entries) and
    ``allowed`` (the allowed range, in words) say where, each None where it does not apply.
    """

    argument = batch_index = prior_index = value = count = allowed = None


class DivergedError(MedaidetError, FloatingPointError):
    """Training diverged: nan or inf where numbers must be finite.

    ``kind``: ``"predictions"`` (the loss found them in ``mb_locs``/``mb_confs``: then
    ``argument``, ``batch_index``, ``prior_index``, ``value`` and ``count`` say where, as
    for :class:`InvalidTargetsError`) or ``"training"`` (the loss or a gradient of a
    training step, or a parameter after it: ``iteration``, and ``snapshot`` with
    ``snapshot_iteration``, the last trainer snapshot, written before and left as it was).
    A ``FloatingPointError``, not a ``ValueError``: nothing the caller passed is wrong, the
    model's arithmetic blew up, and an ``except ValueError`` written for bad annotations
    never swallows it.
    """

    KINDS = ("predictions", "training")
    argument = batch_index = prior_index = value = count = None
    iteration = snapshot = snapshot_iteration = None
    allowed = "finite values"


class DataError(MedaidetError):
    """A dataset, or a sample of one, is missing or wrong (notebooks 01 and 10).

    ``kind`` says what, and the attributes where (None where they do not apply):

    - the dataset's folder and its download: ``"not_found"`` (no dataset where looked),
      ``"download"`` (offline, an HTTP error, a dropped connection; ``offline``: whether
      being offline may be the cause), ``"url"`` (a scheme other than https, http, file),
      ``"archive"`` (not a readable tar), ``"unsafe_archive"`` (a ``member`` that would
      write outside the destination), ``"checksum"`` (files missing or other than the
      pinned manifest: ``problems``), ``"destination"`` (the folder holds other files, or
      cannot be written);
    - its files: ``"split"`` (a split list missing, empty, with a duplicate or malformed
      id), ``"missing_file"`` (a listed id without its annotation or image), ``"image"``
      (an image that cannot be decoded as 8-bit RGB), ``"xml"`` (an annotation that is
      not well-formed VOC XML), ``"unsafe_xml"`` (one declaring a DTD or entities),
      ``"annotation"``, ``"label"`` (an object's ``<name>`` missing or unknown: ``name``),
      ``"image_size"`` (``<size>`` disagrees with the image), ``"yolo"`` (a YOLO label
      file: ``line``), or, with ``strict=True``, the kind of the object the default mode
      would drop or clip; with ``path``, ``image_id`` and ``object_index``;
    - a sample given to a transform or to :func:`~medaidet.ssd.predict.predict`:
      ``"label_range"``, ``"label_dtype"``, ``"shape"``, ``"non_finite_box"``,
      ``"reversed_box"``, ``"image"``, with ``box_index`` and ``value``;
    - ``"worker"``: a data-loading worker process failed with an error that cannot be
      sent to the main process as itself (the message names its type and text).
    """

    path = image_id = object_index = box_index = value = None

    def __init__(self, message="", kind=None, **fields):
        if isinstance(fields.get("path"), str):
            fields["path"] = Path(fields["path"])
        super().__init__(message, kind, **fields)


class ConfigError(MedaidetError, ValueError):
    """A setting is not one medaidet can use: an argument (a number, a name, a file), a
    training config or config file (an unknown key, an impossible value), a seed, gradient
    accumulation, data that leaves nothing to learn from or to evaluate, a NumPy the stack
    does not support. The message begins with the argument or field at fault, as the Python
    API names it (``"iterations: ..."``; the command line puts its flag there instead), and
    says what is expected. ``kind``: None, or ``"seed"``, ``"accumulation"``,
    ``"nothing_to_learn"``, ``"nothing_to_evaluate"``, ``"numpy"``, ``"extra"`` (a package
    of one of medaidet's extras is not installed); for an output that cannot be written
    where asked, with ``path`` (the output): ``"input"`` (it is one of the run's inputs, or
    inside one), ``"not_a_folder"`` (a folder is asked for: the path is a file, or no path),
    ``"not_a_file"`` (a file would replace a folder, a device, a FIFO or a dangling link),
    ``"unwritable"`` (the folder cannot be created or written), ``"not_ours"`` (the folder
    holds someone's files) or ``"clash"`` (two outputs of one run would share a name).
    """

    path = None


class DeviceError(MedaidetError, ValueError):
    """A device cannot be used as asked. ``kind``: ``"spec"`` (not a device spec),
    ``"no_cuda"`` (a GPU is asked for and CUDA cannot be used here), ``"no_gpu"`` (no GPU of
    that number), each with ``spec``; or ``"memory"`` (the device ran out of memory even at
    the smallest batch, with ``report``: the
    :class:`~medaidet.extras.scaling.BatchSizeReport` of every try; or, before training,
    one image needs more than is available: ``needed`` and ``available`` bytes)."""

    KINDS = ("spec", "no_cuda", "no_gpu", "memory")
    spec = None


class WeightsError(MedaidetError):
    """A weight file cannot be used: the model's, SSD300's ImageNet starting weights, or a
    trainer snapshot to resume from.

    ``kind``: ``"missing"`` (not where it should be, and it could not be downloaded:
    ``path``, ``url``), ``"file"`` (not a weight file this reader takes, or empty, truncated
    or damaged), ``"checksum"`` (its sha256 differs from its ``.sha256`` sidecar:
    ``expected``, ``found``), ``"mismatch"`` (it does not fit the model: ``parameter`` is
    missing, extra or another shape, ``expected`` and ``found``), ``"not_finite"`` (it holds
    NaN or inf: ``parameter``, the first such array in name order, and ``count``),
    ``"snapshot"`` (a trainer snapshot that cannot be resumed with this config),
    ``"too_large"`` (an array, or all of them, would take more memory than any model's
    weights: ``parameter``, the entry) or ``"source"`` (one source of ImageNet weights gave
    none; the next is tried).
    """

    KINDS = ("missing", "file", "checksum", "mismatch", "not_finite", "snapshot", "too_large",
             "source")
    path = url = parameter = expected = found = count = None
