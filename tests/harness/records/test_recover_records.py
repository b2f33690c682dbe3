"""``schedscope recover-records`` never destroys data: FILE is replaced only by a whole
merge (a temporary file in its directory, renamed over it), a failure leaves FILE and
every part as they were (and no 0-row FILE), and the clean-up removes only the server's
own part files, never a user's file in ``FILE.parts/`` (docs/serving.md, "Record
files")."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from harness.cli import app
from harness.records.incremental import part_paths, parts_dir, recover_record_file
from tests.support.torn_file import truncate_to_half

runner = CliRunner()


def _rows(start: int, n: int) -> pl.DataFrame:
    return pl.DataFrame(
        {"step": list(range(start, start + n)), "time": [0.5 * i for i in range(start, start + n)]}
    )


def _parts(path: Path, *frames: pl.DataFrame) -> list[Path]:
    """Parts named as the server names them (part-000001.parquet, ...)."""
    folder = parts_dir(path)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, frame in enumerate(frames, 1):
        part = folder / f"part-{number:06d}.parquet"
        frame.write_parquet(part)
        written.append(part)
    return written


def recover(*paths: Path):
    result = runner.invoke(app, ["recover-records", *map(str, paths)])
    return result, " ".join(result.output.split())


def test_a_bad_part_changes_nothing_and_names_the_part(tmp_path):
    """The review's case: an existing 3-row FILE, parts [good, truncated]. Exit 1, the
    FILE keeps its 3 rows, both parts stay, the bad part is named; no temporary is left."""
    path = tmp_path / "steps.parquet"
    _rows(100, 3).write_parquet(path)
    before = path.read_bytes()
    _, bad = _parts(path, _rows(0, 5), _rows(5, 5))
    truncate_to_half(bad)
    result, text = recover(path)
    assert result.exit_code == 1, text
    assert "part-000002.parquet" in text and "nothing was changed" in text
    assert path.read_bytes() == before
    assert len(part_paths(path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.parquet", "steps.parquet.parts"]


def test_parts_of_different_columns_change_nothing(tmp_path):
    path = tmp_path / "steps.parquet"
    _parts(path, _rows(0, 5), pl.DataFrame({"other": ["x"]}))
    result, text = recover(path)
    assert result.exit_code == 1, text
    assert not path.exists(), "no 0-row FILE is left by a failure"
    assert len(part_paths(path)) == 2


def test_a_folder_without_parts_leaves_no_empty_file(tmp_path):
    path = tmp_path / "requests.parquet"
    parts_dir(path).mkdir()
    result, text = recover(path)
    assert result.exit_code == 1, text
    assert "no part" in text
    assert not path.exists()
    assert recover_record_file(path) is None


def test_an_existing_file_is_replaced_only_by_a_whole_merge(tmp_path):
    """A FILE from before the crashed run is what a clean shutdown would have replaced:
    a successful recovery replaces it with every part's rows, in order."""
    path = tmp_path / "steps.parquet"
    _rows(100, 3).write_parquet(path)
    _parts(path, _rows(0, 5), _rows(5, 4))
    result, text = recover(path)
    assert result.exit_code == 0, text
    assert "9 rows recovered" in text and "replaced" in text
    assert_frame_equal(pl.read_parquet(path), _rows(0, 9))
    assert not parts_dir(path).exists()


def test_only_the_server_s_files_are_removed(tmp_path):
    """A user's file in FILE.parts/ (even one that looks like a part) is neither merged
    nor deleted; the folder stays while it holds one, and the output says so."""
    path = tmp_path / "requests.parquet"
    _parts(path, _rows(0, 2), _rows(2, 2))
    folder = parts_dir(path)
    (folder / "notes.txt").write_text("mine")
    _rows(50, 7).write_parquet(folder / "part-mine.parquet")
    (folder / ".part-000003.parquet.tmp").write_bytes(b"PAR1 half a part")  # a killed write
    result, text = recover(path)
    assert result.exit_code == 0, text
    assert pl.read_parquet(path).height == 4
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "part-mine.parquet"]
    assert "notes.txt" in text and "part-mine.parquet" in text


def test_parts_merge_in_the_order_they_were_written(tmp_path):
    """part-1000000 comes after part-999999 (the numbers, not the names, order them)."""
    path = tmp_path / "steps.parquet"
    folder = parts_dir(path)
    folder.mkdir()
    _rows(0, 2).write_parquet(folder / "part-999999.parquet")
    _rows(2, 2).write_parquet(folder / "part-1000000.parquet")
    assert [p.name for p in part_paths(path)] == ["part-999999.parquet", "part-1000000.parquet"]
    assert recover_record_file(path) == 4
    assert pl.read_parquet(path)["step"].to_list() == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["odd[/x]dir", "[bold]x[/bold]"])
def test_a_path_with_brackets_is_printed_as_it_is(tmp_path, name):
    """Rich would read ``[/x]`` as a closing tag (and raise): paths are plain text."""
    path = tmp_path / name / "steps.parquet"
    path.parent.mkdir(parents=True)
    _parts(path, _rows(0, 3))
    result, text = recover(path)
    assert result.exit_code == 0, result.output
    assert f"{name}/steps.parquet: 3 rows recovered" in text
    missing = tmp_path / name / "other.parquet"
    result, text = recover(missing)
    assert result.exit_code == 1 and f"{name}/other.parquet: nothing to recover" in text


def test_a_linked_file_keeps_its_link(tmp_path):
    """FILE a link to a file elsewhere (another disk): the merge replaces the file it
    points to, beside it, and the link stays."""
    elsewhere = tmp_path / "disk" / "steps.parquet"
    elsewhere.parent.mkdir()
    _rows(100, 3).write_parquet(elsewhere)
    path = tmp_path / "steps.parquet"
    path.symlink_to(elsewhere)
    _parts(path, _rows(0, 4))
    assert recover_record_file(path) == 4
    assert path.is_symlink() and pl.read_parquet(elsewhere).height == 4
