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
GLOSSARY = REPO / "docs" / "ja" / "glossary.md"

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


@pytest.mark.parametrize("english, japanese, same", [
    ("x = f(1)  # one", "x = f(1)  # 1 つ", True),
    ('check(a, b, "exercise 1")', 'check(a, b, "演習 1")', True),
    ('print(f"{n} images of {split}")', 'print(f"{split} の画像 {n} 枚")', True),
    ('print(f"{n} images")', 'print(f"{n + 1} 枚")', False),     # what it fills in changed
    ('print("done")', 'print("done!")', False),                 # English changed: copy it
    ("x = f(1)", "x = f(2)", False),
    ("%matplotlib inline\nx = 1", "%matplotlib inline\nx = 1  # 例", True),
    ("%matplotlib inline\nx = 1", "%matplotlib agg\nx = 1", False),
])
def test_what_counts_as_the_same_code(english, japanese, same):
    assert same_code(english, japanese) is same


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


def glossary():
    rows = re.findall(r"(?m)^\| ([^|]+?) \| ([^|]+?) \|", GLOSSARY.read_text(encoding="utf-8"))
    return [(en, ja) for en, ja in rows if en not in ("English", "---")]


def test_the_glossary_has_each_term_and_its_english():
    terms = dict(glossary())
    for en in ("object detection", "default box", "non-maximum suppression (NMS)",
               "average precision (AP), mAP", "learning rate", "batch normalization",
               "reproducibility", "data parallelism"):
        assert en in terms and JAPANESE.search(terms[en]), en


def test_the_readmes_link_each_other_and_give_the_two_commands():
    english = (REPO / "README.md").read_text(encoding="utf-8")
    japanese = (REPO / "README.ja.md").read_text(encoding="utf-8")
    assert "(README.ja.md)" in english.split("\n## ")[0], "README.md: link README.ja.md at the top"
    assert "(README.md)" in japanese.split("\n## ")[0]
    block = re.search(r"(?s)## クイックスタート.*?```bash\n(.*?)```", japanese).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run COURSE_LANG=ja", "make test"]
    assert JAPANESE.search(prose(japanese.split("## Colab")[0]))


# ---- docs/ja/glossary.md, 表記のルール: the rules a test can check ----------------------------

KANA_KANJI = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
JA_NOTEBOOKS = [JA_DIR / p.name for p in EN]
JA_TEXTS = JA_NOTEBOOKS + [REPO / "README.ja.md", GLOSSARY]


def markdown_parts(path):
    """(where, markdown) for each markdown cell of a notebook, or the whole of a .md file."""
    if path.suffix == ".ipynb":
        return [(f"{path.name} cell {i}", c.source) for i, c in enumerate(read(path).cells)
                if c.cell_type == "markdown"]
    return [(path.name, path.read_text(encoding="utf-8"))]


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


@pytest.mark.parametrize("path", [*EN, *JA_NOTEBOOKS], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_markdown_renders_its_emphasis(path):
    """Emphasis that did not open (e.g. `は**`code` 語**`) shows as literal asterisks."""
    left = [f"{where}: {token.content.strip()[:60]!r}" for where, source in markdown_parts(path)
            for token, _ in inline_tokens(source)
            if token.type == "text" and re.search(r"\*\*|(?<![\s\d])\*(?![\s\d])", token.content)]
    assert not left, "emphasis that renders as literal asterisks:\n" + "\n".join(left)


def bold_spacing(markdown: str) -> str:
    """The markdown with a space between a bold span and kana/kanji touching it."""
    letter = re.compile(f"[{KANA_KANJI}]")
    out = []
    for paragraph in re.split(r"(\n\s*\n)", markdown):
        code = [m.span() for m in re.finditer(r"`[^`\n]*`", paragraph)]
        marks = [m.start() for m in re.finditer(r"(?<!\\)\*\*", paragraph)
                 if not any(a <= m.start() < b for a, b in code)]
        cut = [i for k, i in enumerate(marks)
               if k % 2 == 0 and i and letter.match(paragraph[i - 1])]
        cut += [i + 2 for k, i in enumerate(marks)
                if k % 2 and letter.match(paragraph[i + 2:i + 3] or " ")]
        for i in sorted(cut, reverse=True):
            paragraph = paragraph[:i] + " " + paragraph[i:]
        out.append(paragraph)
    return "".join(out)


def sentence_colons(markdown: str) -> list:
    """Colons that join two Japanese sentences (a colon after a short label may stay)."""
    found = []
    for line in prose(markdown).splitlines():
        body = re.sub(r"^\s*(?:[-*]|\d+\.|#+|\|)?\s*", "", line)
        body = re.sub(r"「[^」]*」", "「」", body)      # a quoted title keeps its colon
        for m in re.finditer(rf"(?<=[{KANA_KANJI}）)」*]): (?=.*[{KANA_KANJI}])", body):
            label = body[:m.start()]
            if len(label) > 25 or re.search("[。、:]", label):
                found.append(body[max(0, m.start() - 15):m.end() + 15])
    return found


LONG_VOWELS = ("パラメータ", "オプティマイザ", "フォルダ", "イテレータ", "ドライバ", "ブラウザ",
               "アップデータ", "コンピュータ", "ユーザ", "サーバ", "トレーナ", "ローダ")


@pytest.mark.parametrize("path", JA_TEXTS, ids=lambda p: p.stem)
def test_the_writing_rules(path):
    problems = []
    for where, source in markdown_parts(path):
        text = prose(source)
        if bold_spacing(source) != source:
            problems.append(f"{where}: bold touching kana/kanji: put a space between them")
        problems += [f"{where}: italics on Japanese {token.content[:30]!r}: use bold or 「」"
                     for token, em in inline_tokens(source)
                     if em and token.type == "text" and re.search(f"[{KANA_KANJI}]", token.content)]
        problems += [f"{where}: a colon joins two sentences: …{c}…"
                     for c in sentence_colons(source)]
        problems += [f"{where}: a dash joins a parenthetical: …{m}…"
                     for m in re.findall(r".{0,12}—.{0,12}", text)]
        problems += [f"{where}: numeral {m!r}: write 1 つ, 2 つ"
                     for m in re.findall(r"[一二三四五六七八九]つ|ひとつ|ふたつ|みっつ", text)]
        problems += [f"{where}: long vowel: {m}ー" for m in
                     re.findall(f"({'|'.join(LONG_VOWELS)})(?!ー)", text)]
        problems += [f"{where}: a line break inside a sentence (join the lines): {b}"
                     for b in broken_lines(source)]
    assert not problems, "docs/ja/glossary.md, 表記のルール:\n" + "\n".join(problems)


# Starts something of its own: blank, list item, heading, table, fence, quote, HTML, $$, badge.
OWN_LINE = re.compile(r"\s*(?:$|[*+-] |\d+\. |#|\||```|>|<|\$\$|!?\[!)")
SENTENCE_END = re.compile(r"[。！？][」』）)\]]*$|[:：]$|  $|\\$")


def broken_lines(markdown: str) -> list:
    """Breaks in a Japanese paragraph not at a sentence's end: in Japanese a newline is no word
    space, so Colab, GitHub and the site show a stray space inside the sentence."""
    found, fence = [], False
    lines = markdown.split("\n")
    for line, after in zip(lines, lines[1:]):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence or line.lstrip().startswith(("```", "|", "#")) or OWN_LINE.match(after):
            continue
        if re.search(f"[{KANA_KANJI}]", line) and not SENTENCE_END.search(line):
            found.append(f"…{line.rstrip()[-25:]}⏎{after.lstrip()[:20]}…")
    return found


@pytest.mark.parametrize("markdown, found", [
    ("学習用データで\n学習します。", 1),
    ("`code` を使い、\n学習します。", 1),
    ("(詳しくは README.md)\nを見てください。", 1),
    ("学習します。\n\n次に評価します。", 0),
    ("次のとおりです:\n\n* 学習\n* 評価", 0),
    ("| 表 |\n|---|", 0),
    ("```bash\nmake run  # 実行\nmake test\n```", 0),
])
def test_what_counts_as_a_broken_line(markdown, found):
    assert len(broken_lines(markdown)) == found


def _course_identifiers() -> set:
    """Lowercase words of the course's code and inline code: names, not English, in Japanese."""
    import io
    import keyword
    import tokenize
    words = set()
    for path in [*EN, *JA_NOTEBOOKS]:
        for cell in read(path).cells:
            if cell.cell_type == "markdown":
                names = re.findall(r"`[^`]+`", cell.source)
            else:
                try:
                    names = [t.string for t in tokenize.generate_tokens(
                        io.StringIO(cell.source).readline)
                        if t.type == tokenize.NAME and not keyword.iskeyword(t.string)]
                except (tokenize.TokenError, IndentationError, SyntaxError):
                    names = []
            for name in names:
                words |= set(re.findall(r"[a-z]+", name.lower()))
    return words


# Lowercase names the code does not spell (tools, "import" as a verb). Any other English word
# in a Japanese sentence is said in Japanese, or quoted when the text names the word itself.
NAMES = {"import", "allreduce", "conda", "venv", "pyenv", "papermill", "ipykernel", "pyproject",
         "setuptools", "sdist", "torchvision", "timm"}


def spliced_english(text: str, identifiers: set) -> list:
    """Lowercase Latin words (3+ letters) between Japanese in a sentence, outside code, tags,
    quotes, italics, bold Latin and Latin glosses, that are neither identifiers nor NAMES."""
    text = re.sub(r"`[^`\n]*`", "`", text)
    text = re.sub(r"<[^>\n]+>", "", text)                       # s<sub>k</sub>
    text = re.sub(r"\*\*[A-Za-z][^*\n]*\*\*", "「」", text)       # a value named in bold: **fail**
    text = re.sub(r"(?<![*\w])\*(?!\s)[^*\n]+(?<!\s)\*(?![*\w])", "「」", text)
    text = re.sub(r"「[^」\n]*」|'[^'\n]*'|\"[^\"\n]*\"|“[^”\n]*”", "「」", text)
    text = re.sub(r"\([^()\n]*\)", lambda m: m.group() if re.search(f"[{KANA_KANJI}]", m.group())
                  else "()", text)
    found = []
    for sentence in re.split(r"[。！？\n]", text):
        for m in re.finditer(r"(?<![A-Za-z0-9_./:@-])[a-z]{3,}(?![A-Za-z0-9_/-])", sentence):
            if m.group() in identifiers or m.group() in NAMES:
                continue
            if re.search(f"[{KANA_KANJI}]", sentence[:m.start()]) and \
                    re.search(f"[{KANA_KANJI}]", sentence[m.end():]):
                found.append(f"{m.group()!r} in …{sentence.strip()[:70]}…")
    return found


def japanese_strings(source: str) -> list:
    """The Japanese string literals of a code cell (an f-string's text parts only)."""
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:      # IPython magics: no Japanese text in them
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            text = "".join(parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if re.search(f"[{KANA_KANJI}]", text):
            out.append(text)
    return out


@pytest.mark.parametrize("path", JA_TEXTS[:-1], ids=lambda p: p.stem)
def test_no_english_spliced_into_japanese_sentences(path):
    identifiers = _course_identifiers()
    problems = []
    if path.suffix == ".ipynb":
        for index, cell in enumerate(read(path).cells):
            texts = [prose(cell.source)] if cell.cell_type == "markdown" else \
                japanese_strings(cell.source)
            problems += [f"{path.name} cell {index}: {p}" for text in texts
                         for p in spliced_english(text, identifiers)]
    else:
        problems += [f"{path.name}: {p}" for p in
                     spliced_english(prose(path.read_text(encoding="utf-8")), identifiers)]
    assert not problems, "English spliced into a Japanese sentence:\n" + "\n".join(problems)


@pytest.mark.parametrize("text, found", [
    ("GPU は 1 個 and no usable MPI なので", 2),         # "and" too: a keyword is no name
    ("演習 4 には MPI が必要です", 0),
    ("`medaidet train` で学習します", 0),
    ("重み減衰 (weight decay) は", 0),
    ("判定は「within」(範囲内) です", 0),
    ("chainer の GPU カーネル", 0),
    ("結果は **fail** (講座が動かない) です", 0),
    ("サイズ s<sub>k</sub> の正方形", 0),
    ("実測なら measured です", 1),
])
def test_what_counts_as_spliced_english(text, found):
    assert len(spliced_english(text, {"chainer", "train", "medaidet"})) == found


# Words the glossary or the 2018 course's voice chose against, anywhere in the edition.
CALQUE = "(a calque: say it in Japanese)"
NOT_IN_THE_EDITION = {"テスト用データ": "テストデータ", "テストセット": "テストデータ",
                      "コーダー": "符号化器", "あなた": "(rephrase: お使いの…, 自分の…)",
                      "？": "(end the question with 。: …ですか。)", "訓練": "学習",
                      "境界ボックス": "バウンディングボックス", "非最大抑制": "非最大値抑制",
                      "平均精度": "平均適合率", "既定ボックス": "デフォルトボックス",
                      "事前ボックス": "デフォルトボックス",
                      "用の分割": "学習用データ、検証用データ、テストデータ", "寛容": CALQUE,
                      "変種": CALQUE, "行儀よく": CALQUE, "ゴミ": CALQUE, "百分の数": CALQUE}


@pytest.mark.parametrize("path", JA_TEXTS[:-1], ids=lambda p: p.stem)
def test_the_glossarys_choices_everywhere(path):
    parts = ([(f"cell {i}", c.source) for i, c in enumerate(read(path).cells)]
             if path.suffix == ".ipynb" else [("", path.read_text(encoding="utf-8"))])
    problems = [f"{path.name} {where}: {avoid!r}: {use}" for where, source in parts
                for avoid, use in NOT_IN_THE_EDITION.items() if avoid in source]
    assert not problems, "docs/ja/glossary.md:\n" + "\n".join(problems)
