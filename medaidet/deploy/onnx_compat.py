"""``onnx_chainer`` (shipped with chainer 7.8.1) with today's ``onnx``.

onnx 1.17 removed the module ``onnx.mapping``; ``onnx_chainer`` imports three tables from
it. :func:`apply` puts a module of that name in place, built from the functions that replaced
the tables in ``onnx.helper``, when ``onnx`` no longer has one. Nothing else of
``onnx_chainer`` needs changing for the SSDs of this course (tests/deploy checks the export
against chainer's outputs).
"""
import sys
import types


def _mapping_module():
    from onnx import helper

    module = types.ModuleType("onnx.mapping")
    module.__doc__ = "onnx.mapping's tables, rebuilt by medaidet.deploy.onnx_compat"
    module.TENSOR_TYPE_TO_NP_TYPE, module.NP_TYPE_TO_TENSOR_TYPE = {}, {}
    module.STORAGE_TENSOR_TYPE_TO_FIELD = {}
    for tensor_type in helper.get_all_tensor_dtypes():
        try:
            np_type = helper.tensor_dtype_to_np_dtype(tensor_type)
        except (KeyError, ValueError, TypeError):   # a type NumPy has no dtype for
            continue
        module.TENSOR_TYPE_TO_NP_TYPE[tensor_type] = np_type
        module.NP_TYPE_TO_TENSOR_TYPE.setdefault(np_type, tensor_type)
        # the old table named the field of the types that are stored as themselves only
        if helper.tensor_dtype_to_storage_tensor_dtype(tensor_type) == tensor_type:
            module.STORAGE_TENSOR_TYPE_TO_FIELD[tensor_type] = \
                helper.tensor_dtype_to_field(tensor_type)
    return module


def apply() -> bool:
    """Give ``onnx`` its ``mapping`` module back when it has none; True when it was added."""
    import onnx

    if "onnx.mapping" in sys.modules or hasattr(onnx, "mapping"):
        return False
    module = _mapping_module()
    sys.modules["onnx.mapping"] = module
    onnx.mapping = module
    return True
