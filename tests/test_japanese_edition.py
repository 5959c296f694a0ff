"""The Japanese edition (notebooks/ja/) stays the English one's pair: the same notebooks, code,
sections and exercises, with its text in Japanese."""
import re
import sys
from collections import Counter
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from sync_ja import same_code  # noqa: E402  (tools/ is no package)
EN_DIR, JA_DIR = REPO / "notebooks", REPO / "notebooks" / "ja"
EN = sorted(EN_DIR.glob("*.ipynb"))
PAIRS = [(path, JA_DIR / path.name) for path in EN]
IDS = [path.stem for path in EN]

JAPANESE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
STANDARD_HEADINGS = {"## Recap": "## まとめ", "## Exercises": "## 演習",
                     "## Solutions": "## 解答"}


def read(path):
    return nbformat.read(str(path), as_version=nbformat.NO_CONVERT)


def prose(markdown: str) -> str:
    """The markdown without fenced code, inline code, URLs, link targets and formulas."""
    text = re.sub(r"(?ms)^```.*?^```", "", markdown)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", "", text)
    text = re.sub(r"(?s)\$\$.*?\$\$", "", text)
    text = re.sub(r"\$[^$\n]+\$", "", text)
    return text


def outside_fences(markdown: str) -> str:
    return re.sub(r"(?ms)^```.*?^```", "", markdown)


def headings(markdown: str) -> list:
    return [line for line in outside_fences(markdown).splitlines() if re.match(r"#+ ", line)]


def heading_key(line: str) -> tuple:
    """What a heading keeps in translation: level and number ("1 ·", "Exercise 3" = "演習 3")."""
    level, text = re.match(r"(#+) (.*)", line).groups()
    for en, ja in STANDARD_HEADINGS.items():
        if line.strip() in (en, ja):
            return len(level), en
    number = re.match(r"(?:Exercise |演習 ?)?(\d+)(?: ·|\.)", text)
    kind = "exercise" if re.match(r"Exercise |演習", text) else "section"
    return len(level), (kind, number.group(1)) if number else None


def list_items(markdown: str) -> int:
    return len(re.findall(r"(?m)^\s*(?:[*+-]|\d+\.) ", outside_fences(markdown)))


def table_rows(markdown: str) -> int:
    return len(re.findall(r"(?m)^\|", outside_fences(markdown)))


def code_spans(markdown: str) -> Counter:
    """Inline code, a span broken over two lines counted as on one."""
    return Counter(re.sub(r"\s+", " ", span)
                   for span in re.findall(r"`[^`]+`", outside_fences(markdown)))


def numbers(markdown: str) -> set:
    return set(re.findall(r"\d+(?:[.,]\d+)*", prose(markdown)))


def test_every_english_notebook_has_a_japanese_pair_and_no_other():
    assert JA_DIR.is_dir(), "no notebooks/ja/: the Japanese edition is missing"
    japanese = sorted(p.name for p in JA_DIR.glob("*.ipynb"))
    assert japanese == [p.name for p in EN]


@pytest.mark.parametrize("en,ja", PAIRS, ids=IDS)
def test_same_cells_code_tags_sections_lists_tables_and_numbers(en, ja):
    a, b = read(en), read(ja)
    assert [c.cell_type for c in a.cells] == [c.cell_type for c in b.cells], \
        f"{ja.name}: the cells differ from {en.name} in number or kind"
    assert a.metadata.get("medaidet") == b.metadata.get("medaidet")
    for index, (x, y) in enumerate(zip(a.cells, b.cells)):
        where = f"{ja.name} cell {index}"
        assert x.metadata.get("tags", []) == y.metadata.get("tags", []), \
            f"{where}: tags {y.metadata.get('tags')} != {x.metadata.get('tags')}"
        assert x.metadata.get("jupyter") == y.metadata.get("jupyter"), where
        if x.cell_type == "code":
            assert same_code(x.source, y.source), \
                f"{where}: its code differs from {en.name}'s beyond comments " \
                "and Japanese text in strings: run tools/sync_ja.py"
            continue
        assert [heading_key(h) for h in headings(x.source)] == \
            [heading_key(h) for h in headings(y.source)], \
            f"{where}: headings {headings(y.source)} do not match {headings(x.source)}"
        assert list_items(x.source) == list_items(y.source), f"{where}: list items"
        assert table_rows(x.source) == table_rows(y.source), f"{where}: table rows"
        assert re.findall(r"(?ms)^```.*?^```", x.source) == \
            re.findall(r"(?ms)^```.*?^```", y.source), f"{where}: a code block differs"
        assert code_spans(x.source) == code_spans(y.source), \
            f"{where}: inline code differs: only in English " \
            f"{code_spans(x.source) - code_spans(y.source)}, only in Japanese " \
            f"{code_spans(y.source) - code_spans(x.source)}"
        assert set(re.findall(r"https?://[^\s)>\]]+", x.source)) == \
            set(re.findall(r"https?://[^\s)>\]]+", y.source)), f"{where}: links differ"
        missing = numbers(x.source) - numbers(y.source)
        assert not missing, f"{where}: numbers of the English text missing: {sorted(missing)}"


@pytest.mark.parametrize("en,ja", PAIRS, ids=IDS)
def test_prerequisites_recap_exercises_and_solutions(en, ja):
    text = "\n".join(c.source for c in read(ja).cells if c.cell_type == "markdown")
    english = "\n".join(c.source for c in read(en).cells if c.cell_type == "markdown")
    assert "**前提:**" in text, f"{ja.name}: no '**前提:**' (Prerequisites)"
    assert re.search(r"(?m)^## まとめ$", text), f"{ja.name}: no '## まとめ' (Recap)"
    assert re.search(r"(?m)^## 解答$", text), f"{ja.name}: no '## 解答' (Solutions)"
    listed = re.search(r"(?ms)^## 演習\n(.*?)(?=^## |\Z)", text)
    assert listed, f"{ja.name}: no '## 演習' (Exercises)"
    listed_en = re.search(r"(?ms)^## Exercises\n(.*?)(?=^## |\Z)", english)
    assert re.findall(r"(?m)^(\d+)\. ", listed.group(1)) == \
        re.findall(r"(?m)^(\d+)\. ", listed_en.group(1)), f"{ja.name}: the exercises differ"
    assert re.findall(r"(?m)^### 演習 (\d+) · ", text) == \
        re.findall(r"(?m)^### Exercise (\d+) · ", english), f"{ja.name}: the solutions differ"


@pytest.mark.parametrize("en,ja", PAIRS, ids=IDS)
def test_the_text_is_japanese(en, ja):
    left = []
    for index, cell in enumerate(read(ja).cells):
        if cell.cell_type != "markdown":
            continue
        for block in re.split(r"\n\s*\n|\n(?=\s*(?:[*+-]|\d+\.) )|\n(?=#)", prose(cell.source)):
            for part in block.split("|"):
                words = re.findall(r"[A-Za-z]{3,}", part)
                if len(words) >= 4 and not JAPANESE.search(part):
                    left.append(f"cell {index}: {part.strip()[:80]!r}")
    assert not left, f"{ja.name}: English left untranslated:\n" + "\n".join(left)


def test_the_readmes_link_each_other_and_give_the_two_commands():
    english = (REPO / "README.md").read_text(encoding="utf-8")
    japanese = (REPO / "README.ja.md").read_text(encoding="utf-8")
    assert "(README.ja.md)" in english.split("\n## ")[0], "README.md: link README.ja.md at the top"
    assert "(README.md)" in japanese.split("\n## ")[0]
    block = re.search(r"(?s)## クイックスタート.*?```bash\n(.*?)```", japanese).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run COURSE_LANG=ja", "make test"]
    assert JAPANESE.search(prose(japanese.split("## Colab")[0]))


def markdown_parts(path):
    """(where, markdown) for each markdown cell of a notebook."""
    return [(f"{path.name} cell {i}", c.source) for i, c in enumerate(read(path).cells)
            if c.cell_type == "markdown"]


def inline_tokens(markdown):
    """Every inline token CommonMark makes of the markdown, with whether it sits in <em>."""
    from markdown_it import MarkdownIt
    out = []
    for block in MarkdownIt("commonmark").parse(markdown):
        emphasis = 0
        for token in block.children or []:
            emphasis += {"em_open": 1, "em_close": -1}.get(token.type, 0)
            out.append((token, emphasis > 0))
    return out


@pytest.mark.parametrize("path", [*EN, *(JA_DIR / p.name for p in EN)], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_markdown_renders_its_emphasis(path):
    """Emphasis that did not open (e.g. `は**`code` 語**`) shows as literal asterisks."""
    left = [f"{where}: {token.content.strip()[:60]!r}" for where, source in markdown_parts(path)
            for token, _ in inline_tokens(source)
            if token.type == "text" and re.search(r"\*\*|(?<![\s\d])\*(?![\s\d])", token.content)]
    assert not left, "emphasis that renders as literal asterisks:\n" + "\n".join(left)
