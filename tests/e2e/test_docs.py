"""The docs cannot rot: the commands the README and the guide pages mark runnable are run, on
the example programs, and what they print is checked against the page; the pages' class and
exit-code tables are checked against the classifier's names and the CLI's codes; every relative
link points at a file and heading that exist; and the agents' skill is followed as written.

A page marks a command block runnable with a comment before its fence, and may mark the block
after it as that run's output:

    <!-- docs-test: run exit=1,0 retries=3 -->     exit: each command's code (default 0 each);
    ```sh                                          retries: for a block whose verdict rests on
    detaudit run --runs 2 -- python examples/...   a real race, which may not fire every time
    detaudit replay audit --first-divergence
    ```
    <!-- docs-test: output -->
    ```
    REPLAY r0.main.t-main #51 ...                 each line, in order, is an output line;
    ```                                            "..." stands for any text

A block whose lines start with "$ " holds its commands there and its output below them. A page's
blocks run in order in one directory of their own, where `examples/` and `tests/` are the
repository's and `detaudit` and `python` are the ones under test.
"""
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import time
import unittest

from detaudit_testlib import BIN, PYTHON, SOURCE_DIR, TmpDirCase, log_process_time

GUIDE = ["README.md", "docs/audit.md", "docs/long-runs.md", "docs/resume.md",
         "docs/numerics.md", "docs/ci.md", "docs/replay-and-coverage.md", "docs/verdict.md",
         "docs/agents.md", "docs/skills/detaudit/SKILL.md"]
REFERENCE = ["docs/config.md", "docs/exit-codes.md", "docs/report.md", "docs/trace-format.md",
             "docs/catalog.md", "docs/how-it-works.md", "docs/multi-node.md",
             "docs/performance.md", "docs/testing.md", "docs/gpu.md", "docs/fuzzing.md",
             "docs/index.md"]
SKILL = "docs/skills/detaudit/SKILL.md"
MARK = re.compile(r"<!-- docs-test: (run|output)((?: \w+=[\w,]+)*) -->")
COMMAND_TIMEOUT = 600


class Block:
    def __init__(self, page, line, commands, exits, retries, expected):
        self.page, self.line = page, line
        self.commands, self.exits, self.retries = commands, exits, retries
        self.expected = expected

    def where(self):
        return f"{self.page}:{self.line}"


def read_page(page):
    with open(os.path.join(SOURCE_DIR, page)) as f:
        return f.read().split("\n")


def fence_after(lines, i):
    """The lines of the fenced block that starts at line i (or the next line), and the index
    after its closing fence."""
    while i < len(lines) and not lines[i].startswith("```"):
        if lines[i].strip():
            raise AssertionError(f"a docs-test mark is not followed by a fenced block (line {i})")
        i += 1
    end = i + 1
    while end < len(lines) and not lines[end].startswith("```"):
        end += 1
    return lines[i + 1:end], end + 1


def joined_commands(lines):
    """Shell lines, with backslash continuations joined; blank lines and comment lines dropped."""
    commands, current = [], ""
    for line in lines:
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def runnable_blocks(page):
    lines, blocks, i = read_page(page), [], 0
    while i < len(lines):
        m = MARK.search(lines[i])
        if not m:
            i += 1
            continue
        options = dict(kv.split("=") for kv in m.group(2).split())
        mark_line = i + 1
        body, i = fence_after(lines, i + 1)
        if m.group(1) == "output":
            if not blocks:
                raise AssertionError(f"{page}: an output mark with no run before it")
            blocks[-1].expected += body
            continue
        prompted = [line[2:] for line in body if line.startswith("$ ")]
        commands = joined_commands(prompted if prompted else body)
        expected = [line for line in body if not line.startswith("$ ")] if prompted else []
        exits = ([int(c) for c in options["exit"].split(",")] if "exit" in options
                 else [0] * len(commands))
        if len(exits) != len(commands):
            raise AssertionError(f"{page}: {len(commands)} command(s) and exit={options['exit']}")
        blocks.append(Block(page, mark_line, commands, exits, int(options.get("retries", 1)),
                            expected))
    return blocks


def line_pattern(expected):
    return re.compile(".*".join(re.escape(part) for part in expected.rstrip().split("...")))


def unmatched_lines(expected, output):
    """The expected lines not found, in order, among the output's lines."""
    out = output.split("\n")
    at = 0
    missing = []
    for want in expected:
        if not want.strip() or want.strip() == "...":
            continue
        pattern = line_pattern(want)
        hit = next((j for j in range(at, len(out)) if pattern.fullmatch(out[j].rstrip())), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


def page_environment(directory):
    """PATH with the detaudit under test first, then the Python under test as `python`."""
    bindir = os.path.join(directory, ".bin")
    os.makedirs(bindir, exist_ok=True)
    os.symlink(BIN, os.path.join(bindir, "detaudit"))
    python_dir = os.path.dirname(PYTHON)
    if not os.path.exists(os.path.join(python_dir, "python")):
        os.symlink(PYTHON, os.path.join(bindir, "python"))
    for name in ("examples", "tests"):
        os.symlink(os.path.join(SOURCE_DIR, name), os.path.join(directory, name))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([bindir, python_dir, env.get("PATH", "")])
    env.pop("DETAUDIT_HOOKS", None)
    return env


def run_block(block, directory, env):
    """Runs a block's commands in turn; returns (exit codes, output)."""
    codes, output = [], ""
    for command in block.commands:
        started = time.monotonic()
        r = subprocess.run(["bash", "-c", command], cwd=directory, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=COMMAND_TIMEOUT)
        log_process_time(shlex.split(command)[:12], time.monotonic() - started)
        codes.append(r.returncode)
        output += f"$ {command}\n{r.stdout}"
    return codes, output


def block_failure(block, codes, output):
    """Why a block's run does not match its page, or None."""
    if codes != block.exits:
        return f"exit codes {codes}, the page says {block.exits}"
    missing = unmatched_lines(block.expected, output)
    if missing:
        return "the page's lines not printed: " + " | ".join(m.strip() for m in missing)
    return None


def follow_page(page, root):
    """Runs a page's blocks in order; returns [(block, failure or None, output)], or the page's
    own error (a mark without a block, exits that do not match the commands) as a string."""
    directory = os.path.join(root, page.replace("/", "_"))
    os.makedirs(directory)
    env = page_environment(directory)
    results = []
    try:
        blocks = runnable_blocks(page)
    except AssertionError as e:
        return str(e)
    for block in blocks:
        for attempt in range(block.retries):
            codes, output = run_block(block, directory, env)
            failure = block_failure(block, codes, output)
            if failure is None:
                break
        results.append((block, failure, output))
    return results


def table_rows(page, header_first_cell):
    """The first cells of the rows of each table whose header starts with that cell."""
    rows, inside = [], False
    for line in read_page(page):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            inside = False
        elif cells[0] == header_first_cell:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows.append(cells[0])
    return rows


def cli_exit_codes():
    with open(os.path.join(SOURCE_DIR, "src/util/status.h")) as f:
        enum = re.search(r"enum class ExitCode : int \{(.*?)\};", f.read(), re.S).group(1)
    return {int(v) for v in re.findall(r"k\w+ = (\d+)", enum)}


def classifier_classes():
    """The classes the diff can name: divergence_class_name's words, and the replica check's."""
    names = set()
    with open(os.path.join(SOURCE_DIR, "src/diff/report_model.h")) as f:
        body = re.search(r"divergence_class_name\(DivergenceClass c\) \{(.*?)\n\}", f.read(), re.S)
    names.update(n for n in re.findall(r'return "([a-z-]+)";', body.group(1)))
    diff_dir = os.path.join(SOURCE_DIR, "src/diff")
    for name in os.listdir(diff_dir):
        with open(os.path.join(diff_dir, name)) as f:
            names.update(re.findall(r'\{"class", "([a-z-]+)"\}', f.read()))
    return names


def heading_anchors(page):
    anchors, fenced = set(), False
    for line in read_page(page):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            text = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


class Pages(TmpDirCase):
    """Every guide page's runnable blocks, run once for all the tests below (two pages at once)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            runs = {page: pool.submit(follow_page, page, cls.tmp) for page in GUIDE}
            cls.results = {page: f.result() for page, f in runs.items()}

    def check_page(self, page, at_least):
        results = self.results[page]
        self.assertNotIsInstance(results, str, results)
        self.assertGreaterEqual(len(results), at_least, f"{page}: too few runnable blocks")
        for block, failure, output in results:
            self.assertIsNone(failure, f"{block.where()}: {failure}\n{output[-4000:]}")

    def test_readme_verdict(self):
        self.check_page("README.md", 1)

    def test_auditing_a_run(self):
        self.check_page("docs/audit.md", 1)

    def test_long_runs(self):
        self.check_page("docs/long-runs.md", 1)

    def test_resume(self):
        self.check_page("docs/resume.md", 1)

    def test_numerics(self):
        self.check_page("docs/numerics.md", 1)

    def test_ci(self):
        self.check_page("docs/ci.md", 1)

    def test_replay(self):
        self.check_page("docs/replay-and-coverage.md", 1)

    def test_reading_the_verdict(self):
        self.check_page("docs/verdict.md", 2)

    def test_the_skill_followed_as_written(self):
        self.check_page(SKILL, 5)

    def test_the_skills_fields_are_in_the_report_it_made(self):
        directory = os.path.join(self.tmp, SKILL.replace("/", "_"))
        with open(os.path.join(directory, "report.json")) as f:
            report = json.load(f)
        fields = table_rows(SKILL, "field")
        self.assertGreaterEqual(len(fields), 8, fields)
        for cell in fields:
            parent = ""
            for path in re.findall(r"`([\w.]+)`", cell):
                if path.startswith("."):
                    path = parent + path
                parent = path.rsplit(".", 1)[0] if "." in path else ""
                node = report
                for key in path.split("."):
                    self.assertIsInstance(node, dict, f"{SKILL}: `{path}`: {key} under a non-object")
                    self.assertIn(key, node, f"{SKILL}: the report has no `{path}`")
                    node = node[key] if node[key] is not None else {}


class Tables(unittest.TestCase):
    def test_every_exit_code_table_is_the_clis(self):
        codes = cli_exit_codes()
        self.assertEqual(codes, set(range(9)), "src/util/status.h's ExitCode")
        for page in ["docs/ci.md", "docs/exit-codes.md", SKILL]:
            rows = table_rows(page, "exit code") or table_rows(page, "code")
            self.assertEqual({int(r) for r in rows}, codes, f"{page}'s exit-code table")

    def test_the_class_tables_are_the_classifiers(self):
        classes = classifier_classes()
        self.assertIn("nondeterministic-op", classes)
        rows = {r.strip("`") for r in table_rows("docs/verdict.md", "class")}
        self.assertEqual(rows, classes, "docs/verdict.md's class table")
        with open(os.path.join(SOURCE_DIR, SKILL)) as f:
            listed = re.search(r"^Classes: (.*?)\n\n", f.read(), re.S | re.M).group(1)
        self.assertEqual(set(re.findall(r"`([a-z-]+)`", listed)), classes, f"{SKILL}'s classes")

    def test_relative_links_reach_a_file_and_heading(self):
        broken = []
        for page in GUIDE + REFERENCE:
            text = "\n".join(read_page(page))
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"\w+://", target):
                    continue
                path, _, anchor = target.partition("#")
                file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(os.path.join(SOURCE_DIR, file)):
                    broken.append(f"{page}: {target} (no file)")
                elif anchor and file.endswith(".md") and anchor not in heading_anchors(file):
                    broken.append(f"{page}: {target} (no such heading)")
        self.assertEqual(broken, [])

    def test_readme_fits_a_newcomers_five_minutes(self):
        readme = read_page("README.md")
        self.assertLessEqual(len(readme), 150, "README.md's lines")
        first_screen = "\n".join(readme[:60])
        self.assertIn("bash examples/quickstart.sh", first_screen)
        self.assertIn("bash tests/run_all.sh", first_screen)

    def test_performance_is_results_not_lab_notes(self):
        self.assertLessEqual(len(read_page("docs/performance.md")), 400)

    def test_the_skill_loads_as_a_skill(self):
        lines = read_page(SKILL)
        self.assertEqual(lines[0], "---")
        front = lines[1:lines.index("---", 1)]
        keys = dict(line.split(": ", 1) for line in front)
        self.assertEqual(keys.get("name"), "detaudit")
        self.assertGreater(len(keys.get("description", "")), 50)


if __name__ == "__main__":
    unittest.main()
