"""medaidet's named errors: one per boundary, each a :class:`MedaidetError`.

Messages name what is at fault and how to fix it; ``kind``, a short word, tells the cases apart
for code and tests; other facts (the file, the batch, the iteration, ...) are attributes.
"""
from pathlib import Path


class MedaidetError(Exception):
    """Base class: ``message``, ``kind`` (one of ``KINDS``, if any) and keyword attributes."""

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

    ``kind``: ``"mpi"`` (mpi4py, MPI or ``mpiexec`` missing), ``"communicator"`` (rejected by
    ChainerMN 7, or unfit for the device), ``"ranks"`` (a setting that does not fit the number of
    ranks), ``"launch"`` (``mpiexec`` failed or timed out: ``command``, ``returncode`` (None on a
    timeout), ``output``, ``tail``) or ``"diverged"`` (ranks ended with different parameters:
    ``digests``, the sha256 by rank).
    """

    KINDS = ("mpi", "communicator", "ranks", "launch", "diverged")


class InvalidTargetsError(MedaidetError, ValueError):
    """The loss's inputs disagree in shape or dtype, or its targets hold invalid values
    (notebook 02, section 7). ``argument``, ``batch_index``, ``prior_index``, ``value`` (first
    bad), ``count`` and ``allowed`` (in words) say where; None where they do not apply."""

    argument = batch_index = prior_index = value = count = allowed = None


class DivergedError(MedaidetError, FloatingPointError):
    """Training diverged: nan or inf where numbers must be finite. ``kind``: ``"predictions"``
    (in ``mb_locs``/``mb_confs``; where, as for :class:`InvalidTargetsError`) or ``"training"``
    (loss, gradient or parameter: ``iteration``, the last ``snapshot``, ``snapshot_iteration``).
    A ``FloatingPointError``, not a ``ValueError``: nothing the caller passed is wrong."""

    KINDS = ("predictions", "training")
    argument = batch_index = prior_index = value = count = None
    iteration = snapshot = snapshot_iteration = None
    allowed = "finite values"


class DataError(MedaidetError):
    """A dataset, or a sample of one, is missing or wrong (notebooks 01 and 10). ``kind``:

    - dataset and download: ``"not_found"``, ``"download"`` (``offline``: whether that may be
      the cause), ``"url"`` (not https, http or file), ``"archive"`` (not a readable tar),
      ``"unsafe_archive"`` (a ``member`` writing outside the destination), ``"checksum"``
      (``problems`` against the pinned manifest), ``"destination"`` (other files, unwritable);
    - files (``path``, ``image_id``, ``object_index``): ``"split"``, ``"missing_file"``,
      ``"image"`` (not decodable as 8-bit RGB), ``"xml"``, ``"unsafe_xml"`` (a DTD or
      entities), ``"annotation"``, ``"label"`` (``name``), ``"image_size"``, ``"yolo"``
      (``line``), or with ``strict=True`` the kind the default mode would drop or clip;
    - a sample given to a transform or ``predict`` (``box_index``, ``value``):
      ``"label_range"``, ``"label_dtype"``, ``"shape"``, ``"non_finite_box"``,
      ``"reversed_box"``, ``"image"``;
    - ``"worker"``: a worker's error that cannot be sent to the main process as itself.
    """

    path = image_id = object_index = box_index = value = None

    def __init__(self, message="", kind=None, **fields):
        if isinstance(fields.get("path"), str):
            fields["path"] = Path(fields["path"])
        super().__init__(message, kind, **fields)


class ConfigError(MedaidetError, ValueError):
    """A setting medaidet cannot use (an argument, a config or config file, a seed, data with
    nothing to learn or evaluate, an unsupported NumPy). The message begins with the field as
    the Python API names it. ``kind``: None, ``"seed"``, ``"accumulation"``,
    ``"nothing_to_learn"``, ``"nothing_to_evaluate"``, ``"numpy"``, ``"extra"`` (an extra's
    package missing); for an output, with ``path``: ``"input"`` (one of the run's inputs, or
    inside one), ``"not_a_folder"``, ``"not_a_file"`` (would replace a folder, device, FIFO or
    dangling link), ``"unwritable"``, ``"not_ours"`` (holds someone's files) or ``"clash"``
    (two outputs of one run share a name).
    """

    path = None


class DeviceError(MedaidetError, ValueError):
    """A device cannot be used as asked. ``kind``: ``"spec"``, ``"no_cuda"``, ``"no_gpu"`` (each
    with ``spec``) or ``"memory"`` (out of memory at the smallest batch: ``report``, a
    :class:`~medaidet.extras.scaling.BatchSizeReport`; or one image needs more than is
    available before training: ``needed``, ``available`` bytes)."""

    KINDS = ("spec", "no_cuda", "no_gpu", "memory")
    spec = None


class WeightsError(MedaidetError):
    """A weight file (the model's, SSD300's ImageNet weights, a trainer snapshot) cannot be used.

    ``kind``: ``"missing"`` (absent and not downloadable: ``path``, ``url``), ``"file"`` (not a
    weight file, or empty, truncated, damaged), ``"checksum"`` (sha256 differs from the
    ``.sha256`` sidecar: ``expected``, ``found``), ``"mismatch"`` (``parameter`` missing, extra
    or another shape), ``"not_finite"`` (``parameter``, first in name order, and ``count``),
    ``"snapshot"`` (not resumable with this config), ``"too_large"`` (``parameter`` would take
    more memory than any model's weights) or ``"source"`` (one ImageNet source gave none).
    """

    KINDS = ("missing", "file", "checksum", "mismatch", "not_finite", "snapshot", "too_large",
             "source")
    path = url = parameter = expected = found = count = None
