"""Malformed-input corpus from five real BCCD files: loader and validator name every defect."""
import shutil
import sys
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import numpy as np
import pytest
from PIL import Image

from medaidet.data import SPLITS
from medaidet.data import bccd as bccd_module
from medaidet.errors import DataError, MedaidetError
from medaidet.data.bccd import AnnotationWarning, BCCDDataset
from medaidet.data.validate import validate_dataset
from conftest import write_split

SPLIT_LISTS = {"train": ["BloodImage_00001", "BloodImage_00003"],
               "val": ["BloodImage_00000", "BloodImage_00002"],
               "test": ["BloodImage_00004"]}
SPLIT_LISTS["trainval"] = SPLIT_LISTS["val"] + SPLIT_LISTS["train"]
TARGET = "BloodImage_00001"          # in train and trainval; 19 objects
TARGET_OBJECTS = 19


@pytest.fixture
def root(bccd_copy):
    """Five real BCCD images with their annotations and our own split lists."""
    return bccd_copy(sorted({i for ids in SPLIT_LISTS.values() for i in ids}), SPLIT_LISTS)


def xml_file(root, image_id=TARGET):
    return root / "Annotations" / f"{image_id}.xml"


def jpg_file(root, image_id=TARGET):
    return root / "JPEGImages" / f"{image_id}.jpg"


def edit(change):
    """A mutation applying ``change(annotation_element, objects)`` to TARGET's (real) XML."""
    def mutate(root):
        tree = ET.parse(xml_file(root))
        change(tree.getroot(), tree.getroot().findall("object"))
        tree.write(xml_file(root))
    return mutate


def set_coords(index, **values):
    def change(_, objects):
        for tag, value in values.items():
            objects[index].find("bndbox").find(tag).text = value
    return edit(change)


def remove(index, path):
    def change(_, objects):
        parent = objects[index] if "/" not in path else objects[index].find(path.split("/")[0])
        parent.remove(parent.find(path.split("/")[-1]))
    return edit(change)


def append_copy(index, shift=0):
    def change(annotation, objects):
        copy = ET.fromstring(ET.tostring(objects[index]))
        for tag in ("xmin", "xmax"):
            element = copy.find("bndbox").find(tag)
            element.text = str(int(element.text) + shift)
        annotation.append(copy)
    return edit(change)


def replace_xml(text, *pairs):
    """A mutation writing ``text`` as TARGET's XML (None: its text, each ``(old, new)`` of
    ``pairs`` replaced)."""
    def mutate(root):
        new = xml_file(root).read_text() if text is None else text
        for old, replacement in pairs:
            new = new.replace(old, replacement)
        xml_file(root).write_text(new)
    return mutate


OBJECT = ("<object><name>RBC</name><difficult>0</difficult><bndbox><xmin>10</xmin>"
          "<ymin>10</ymin><xmax>90</xmax><ymax>90</ymax></bndbox></object>")
BILLION_LAUGHS = ('<?xml version="1.0"?>\n<!DOCTYPE annotation [\n  <!ENTITY lol1 "lol">\n'
                  + "".join(f'  <!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">\n' for i in range(2, 10))
                  + "]>\n<annotation><filename>&lol9;</filename>" + OBJECT + "</annotation>")


def external_entity_xml(secret_path):
    return (f'<?xml version="1.0"?>\n<!DOCTYPE annotation [\n  <!ENTITY xxe SYSTEM '
            f'"file://{secret_path}">\n]>\n<annotation><filename>&xxe;</filename>'
            f'{OBJECT.replace("RBC", "&xxe;")}</annotation>')


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def resize_image(root):
    with Image.open(jpg_file(root)) as img:
        img.resize((320, 240)).save(jpg_file(root), quality=90)


def resave_image(convert, image_format="PNG"):
    """Replace TARGET's image by ``convert(rgb)``, saved as ``image_format`` under its ``.jpg``."""
    def mutate(root):
        with Image.open(jpg_file(root)) as img:
            rgb = np.asarray(img.convert("RGB"))
        convert(rgb).save(jpg_file(root), format=image_format)
    return mutate


def with_alpha(rgb, transparent=False):
    alpha = np.full(rgb.shape[:2], 255, dtype=np.uint8)
    if transparent:
        alpha[:60, :80] = 0
    return Image.fromarray(np.dstack([rgb, alpha]))


def gray_of(rgb):
    """PIL's 8-bit grayscale of ``rgb``: uint8 (H, W)."""
    return np.asarray(Image.fromarray(rgb).convert("L"))


def gray_16bit(rgb):
    return Image.fromarray(gray_of(rgb).astype(np.uint16) * 257)    # mode I;16, 0..65535


@dataclass
class Dropped:
    """Default mode drops object ``index`` of TARGET with a warning; strict mode raises."""
    kind: str
    index: int
    severity: str = "error"


@dataclass
class Clipped(Dropped):
    """Default mode clips the box with a warning; strict mode raises."""
    severity: str = "warning"


XML, JPG, LIST = f"Annotations/{TARGET}.xml", f"JPEGImages/{TARGET}.jpg", "ImageSets/Main/"


@dataclass
class Refused:
    """Building ``split`` raises a DataError (both modes) with these fields (path: root's)."""
    kind: str
    path: str = XML
    split: str = "train"
    image_id: str = TARGET
    object_index: int = None


class ReadFails:
    """Building works; reading TARGET's image raises DataError naming the file."""


class Accepted:
    """Every split loads in strict mode; TARGET's boxes equal the unmodified ones."""


def found(kind, image=TARGET, obj=None, severity="error"):
    """The validator's finding ``(kind, image, object, severity)``, as a set of one."""
    return {(kind, image, obj, severity)}


@dataclass
class Case:
    mutate: object
    loader: object
    issues: set = None    # {(kind, image, object, severity)} that must appear; default: the drop's
    other_kinds: set = field(default_factory=set)   # further kinds allowed in the report

    def __post_init__(self):
        if self.issues is None:
            self.issues = found(self.loader.kind, obj=self.loader.index,
                                severity=self.loader.severity)


CASES = {
    "reversed_coordinates": Case(set_coords(2, xmin="300", xmax="200"),
                                 Dropped("bad_coordinates", 2)),
    "non_numeric_coordinate": Case(set_coords(1, ymin="12px"), Dropped("bad_coordinates", 1)),
    "nan_coordinate": Case(set_coords(3, xmax="nan"), Dropped("bad_coordinates", 3)),
    "missing_bndbox": Case(remove(4, "bndbox"), Dropped("bad_coordinates", 4)),
    "missing_coordinate": Case(remove(5, "bndbox/ymax"), Dropped("bad_coordinates", 5)),
    "zero_area_box": Case(edit(lambda _, o: setattr(o[2].find("bndbox/xmax"), "text",
                                                    o[2].findtext("bndbox/xmin"))),
                          Dropped("zero_area", 2)),
    "box_outside_image": Case(set_coords(6, xmin="700", xmax="760"), Dropped("out_of_bounds", 6)),
    "box_overhanging_border": Case(          # object 0 ends on the last row (ymax 480)
        set_coords(0, ymax="481"), Clipped("out_of_bounds", 0)),
    "exact_copy_of_a_box": Case(                 # IoU 1: a near duplicate too
        append_copy(8), Dropped("near_duplicate_box", TARGET_OBJECTS)),
    "near_duplicate_box": Case(append_copy(9, shift=2), Dropped("near_duplicate_box",
                                                                TARGET_OBJECTS)),
    "unknown_label": Case(edit(lambda _, o: setattr(o[3].find("name"), "text", "Neutrophil")),
                          Refused("label", object_index=3), found("unknown_label", obj=3)),
    "missing_object_name": Case(remove(2, "name"), Refused("label", object_index=2),
                                found("unknown_label", obj=2)),
    "label_other_case_and_spaces": Case(
        replace_xml(None, ("<name>RBC</name>", "<name>  rbc\t</name>"),
                    ("<name>WBC</name>", "<name>Wbc</name>"),
                    ("<name>Platelets</name>", "<name>PLATELETS </name>")), Accepted(), set()),
    "entity_expansion_billion_laughs": Case(
        replace_xml(BILLION_LAUGHS), Refused("unsafe_xml"), found("parse_error")),
    "external_dtd": Case(
        replace_xml('<?xml version="1.0"?>\n<!DOCTYPE annotation SYSTEM '
                    '"http://127.0.0.1:9/voc.dtd">\n<annotation>' + OBJECT + "</annotation>"),
        Refused("unsafe_xml"), found("parse_error")),
    "not_xml": Case(replace_xml("BloodImage_00001.jpg RBC 68 315 286 480\n"), Refused("xml"),
                    found("parse_error")),
    "truncated_xml": Case(lambda r: truncate(xml_file(r)), Refused("xml"), found("parse_error")),
    "wrong_root_element": Case(replace_xml("<html><body>" + OBJECT + "</body></html>"),
                               Refused("xml"), found("parse_error")),
    "bogus_encoding_declaration": Case(
        replace_xml('<?xml version="1.0" encoding="no-such-codec"?><annotation/>'),
        Refused("xml"), found("parse_error")),
    "truncated_jpeg": Case(lambda r: truncate(jpg_file(r)), ReadFails(), found("bad_image")),
    "not_an_image": Case(lambda r: jpg_file(r).write_text("not a JPEG"), Refused("image", JPG),
                         found("bad_image")),
    "xml_size_disagrees_with_image": Case(
        replace_xml(None, ("<width>640</width>", "<width>320</width>")), Refused("image_size"),
        found("size_mismatch")),
    # one decode rule for loader and validator; a converted image loads (<depth> may disagree)
    "rgba_png_saved_as_jpg": Case(
        resave_image(with_alpha), Accepted(), set(), {"metadata_mismatch"}),
    "rgba_with_transparent_pixels": Case(
        resave_image(lambda rgb: with_alpha(rgb, transparent=True)), ReadFails(),
        found("bad_image"), {"metadata_mismatch"}),
    "grayscale_16bit_png_saved_as_jpg": Case(
        resave_image(gray_16bit), Accepted(), set(), {"metadata_mismatch"}),
    "grayscale_8bit_jpeg": Case(
        resave_image(lambda rgb: Image.fromarray(gray_of(rgb)), "JPEG"), Accepted(),
        set(), {"metadata_mismatch"}),
    "image_resized_after_annotation": Case(
        resize_image, Refused("image_size"), found("size_mismatch"), {"out_of_bounds"}),
    # a bad split list is the loader's error; the report leaves it
    "listed_id_without_files": Case(
        lambda r: [write_split(r, s, SPLIT_LISTS[s] + ["BloodImage_99999"])
                   for s in ("train", "trainval")],
        Refused("missing_file", "Annotations/BloodImage_99999.xml", image_id="BloodImage_99999"),
        found("missing_file", "BloodImage_99999")),
    "missing_image_file": Case(lambda r: jpg_file(r).unlink(), Refused("missing_file", JPG),
                               found("missing_file")),
    "duplicate_id_in_split": Case(
        lambda r: write_split(r, "train", SPLIT_LISTS["train"] + [TARGET]),
        Refused("split", LIST + "train.txt"), set()),
    "empty_split_file": Case(
        lambda r: write_split(r, "test", []),
        Refused("split", LIST + "test.txt", "test", None), set()),
    "missing_split_file": Case(
        lambda r: (r / "ImageSets/Main/val.txt").unlink(),
        Refused("split", LIST + "val.txt", "val", None), set()),
    "path_in_split_list": Case(
        lambda r: write_split(r, "train", SPLIT_LISTS["train"] + ["../../etc/passwd"]),
        Refused("split", LIST + "train.txt", image_id="../../etc/passwd"), set()),
    "split_list_not_utf8": Case(
        lambda r: (r / "ImageSets/Main/train.txt").write_bytes(b"\xff\xfeB\x00\xff\n"),
        Refused("split", LIST + "train.txt", image_id=None), set()),
    "id_in_train_and_test": Case(
        lambda r: write_split(r, "test", SPLIT_LISTS["test"] + [TARGET]),
        Accepted(), set()),
    "metadata_disagrees": Case(
        replace_xml(None, (f"<filename>{TARGET}.jpg", "<filename>BloodImage_00999.jpg")),
        Accepted(), found("metadata_mismatch", severity="info")),
}


def load_everything(root, strict):
    """Build every split and read every example; return the errors (all must be ours)."""
    errors = []
    for split in SPLITS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", AnnotationWarning)
                dataset = BCCDDataset(root, split, strict=strict)
                for i in range(len(dataset)):
                    dataset[i]
        except MedaidetError as exc:
            errors.append(exc)
    return errors


def target_boxes(root, strict=True):
    dataset = BCCDDataset(root, "train", strict=strict)
    return dataset[dataset.ids.index(TARGET)][1:]


def test_base_corpus_is_clean(root):
    assert not load_everything(root, strict=True)
    report = validate_dataset(root)
    assert report.issues == [] and report.ok


@pytest.mark.parametrize("name", sorted(CASES))
def test_loader(name, root):
    case = CASES[name]
    expected = case.loader
    original = target_boxes(root)
    case.mutate(root)
    load_everything(root, strict=False)
    load_everything(root, strict=True)
    bccd_module._REPORTED.clear()     # each report again, as a fresh process shows it

    if isinstance(expected, Dropped):
        verb = "clipped" if isinstance(expected, Clipped) else "dropped"
        with pytest.warns(AnnotationWarning, match=rf"{verb} .*{TARGET}.*object {expected.index}"):
            dataset = BCCDDataset(root, "train")
        records = dataset.clipped if isinstance(expected, Clipped) else dataset.dropped
        assert [(d.image_id, d.index, d.kind) for d in records] == [
            (TARGET, expected.index, expected.kind)]
        bbox, label = dataset[dataset.ids.index(TARGET)][1:]
        # a clipped box stays; a dropped copy leaves the original 19; else one box less
        kept = TARGET_OBJECTS - (not isinstance(expected, Clipped)
                                 and expected.index < TARGET_OBJECTS)
        assert len(bbox) == kept and bbox.dtype == np.float32 and label.dtype == np.int32
        assert np.all(bbox[:, 2:] > bbox[:, :2]) and np.all(bbox >= 0)
        assert np.all(bbox[:, 2] <= 479) and np.all(bbox[:, 3] <= 639)
        with pytest.raises(DataError) as info:
            BCCDDataset(root, "train", strict=True)
        error = info.value
        assert (error.kind, error.path, error.object_index) == (
            expected.kind, xml_file(root), expected.index)
    elif isinstance(expected, Refused):
        for strict in (False, True):
            with pytest.raises(DataError) as info:
                BCCDDataset(root, expected.split, strict=strict)
            error = info.value
            assert (error.kind, error.path, error.image_id, error.object_index) == (
                expected.kind, root / expected.path, expected.image_id, expected.object_index)
    elif isinstance(expected, ReadFails):
        dataset = BCCDDataset(root, "train", strict=True)
        with pytest.raises(DataError) as info:
            dataset[dataset.ids.index(TARGET)]
        assert info.value.path == jpg_file(root)
        # the boxes are still available without decoding the image
        assert len(dataset.slice[:, "bbox"][dataset.ids.index(TARGET)]) == TARGET_OBJECTS
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", AnnotationWarning)
            assert not load_everything(root, strict=True)
            bbox, label = target_boxes(root)
        np.testing.assert_array_equal(bbox, original[0])
        np.testing.assert_array_equal(label, original[1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_validator(name, root):
    case = CASES[name]
    case.mutate(root)
    report = validate_dataset(root)
    found = {(i.kind, i.image, i.object, i.severity) for i in report.issues}
    assert case.issues <= found, str(report)
    expected_kinds = {kind for kind, *_ in case.issues} | case.other_kinds
    assert set(report.counts()) <= expected_kinds, str(report)
    for issue in report.issues:
        assert issue.detail and issue.action
    assert report.ok is not any(severity == "error" for *_, severity in case.issues)
    report.to_json()
    if any(i[0] in ("parse_error", "missing_file", "unknown_label", "size_mismatch", "bad_image")
           for i in case.issues):
        assert report.objects_kept < 5 * TARGET_OBJECTS    # the refused image is not counted


def test_external_entity_is_never_read(root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    xml_file(root).write_text(external_entity_xml(secret))
    opened = []
    active = [True]

    def audit(event, args):
        if active[0] and event == "open" and args and str(args[0]) == str(secret):
            opened.append(args)

    sys.addaudithook(audit)       # hooks cannot be removed: this one switches itself off
    try:
        with pytest.raises(DataError) as info:
            BCCDDataset(root, "train")
        report = validate_dataset(root)
    finally:
        active[0] = False
    assert not opened
    assert "TOP-SECRET-CONTENT" not in str(info.value)
    assert "TOP-SECRET-CONTENT" not in report.to_json()
    assert {(i.kind, i.image) for i in report.issues} == {("parse_error", TARGET)}


CONVERTED = {
    "rgba_png_saved_as_jpg": lambda rgb: rgb,
    "grayscale_16bit_png_saved_as_jpg": lambda rgb: np.repeat(gray_of(rgb)[:, :, None], 3, axis=2),
}


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_converted_image_loads_as_8_bit_rgb(name, root):
    """16-bit values are scaled (65535 -> 255), not clipped to white."""
    expected = CONVERTED[name]
    with Image.open(jpg_file(root)) as img:
        rgb = np.asarray(img.convert("RGB"))
    CASES[name].mutate(root)
    dataset = BCCDDataset(root, "train", strict=True)
    img = dataset[dataset.ids.index(TARGET)][0]
    assert img.dtype == np.float32 and img.shape == (3, 480, 640)
    np.testing.assert_array_equal(img, expected(rgb).transpose(2, 0, 1).astype(np.float32))


def test_transparent_image_is_refused_with_the_same_message_by_both(root):
    CASES["rgba_with_transparent_pixels"].mutate(root)
    dataset = BCCDDataset(root, "train", strict=True)
    with pytest.raises(DataError) as info:
        dataset[dataset.ids.index(TARGET)]
    [issue] = validate_dataset(root).by_kind("bad_image")
    assert issue.detail == str(info.value) and "4800 transparent pixel(s)" in issue.detail


def test_files_no_split_lists_are_neither_validated_nor_loaded(root, bccd_root):
    shutil.copy(bccd_root / "Annotations" / "BloodImage_00005.xml", root / "Annotations")
    shutil.copy(bccd_root / "JPEGImages" / "BloodImage_00005.jpg", root / "JPEGImages")
    report = validate_dataset(root)
    assert report.issues == [] and report.images == 5
    assert not load_everything(root, strict=True)
