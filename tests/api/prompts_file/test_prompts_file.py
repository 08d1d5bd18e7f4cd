"""A prompts file's lines and results file (api/prompts_file/) without a model: reading a prompts file
or stream, resuming from a results file (a line torn by a kill cut off, superseded errors taken out,
every result kept), and writing results as durable lines."""

import io
import json
import os
import subprocess
import sys
import threading

import pytest

from specgen.api.prompts_file import results as batch_results
from specgen.api.prompts_file.items import BadLine, Item, read_items
from specgen.api.prompts_file.results import ResultWriter
from specgen.cli.bench import read_prompt_file
from specgen.errors import InputError, SettingError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_jsonl_rows_ids_default_to_line_numbers_and_extra_fields_come_through(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([json.dumps({"prompt": "a"}), "",
                            json.dumps({"id": "x", "messages": CHAT, "set": "ignored"}),
                            json.dumps({"id": 7, "prompt": "b", "prediction": "b!", "max_tokens": 5})]) + "\n")
    assert list(read_items(str(f))) == [Item("1", 1, "a"), Item("x", 3, CHAT), Item("7", 4, "b", "b!", 5)]


def test_plain_text_lines_from_a_stream_keep_their_line_numbers():
    stream = io.StringIO("Once upon a time\n\n  \n[not JSON, so a prompt]\r\nlast")
    assert list(read_items(stream)) == [Item("1", 1, "Once upon a time"),
                                        Item("4", 4, "[not JSON, so a prompt]"), Item("5", 5, "last")]


def test_each_line_is_json_or_plain_text_on_its_own():
    stream = io.StringIO('{"prompt": "a"}\nplain b\n  {"id": "c", "prompt": "c"}\n"quoted," she said\n'
                         '{"prompt": "torn\n{ a brace, then text }\n')
    got = list(read_items(stream))
    assert got[:4] == [Item("1", 1, "a"), Item("2", 2, "plain b"), Item("c", 3, "c"),
                       Item("4", 4, '"quoted," she said')]
    assert [(x.line, x.id) for x in got[4:]] == [(5, None), (6, None)]  # not run as text
    assert all(x.error.startswith("not JSON") and "{\"prompt\"" in x.error for x in got[4:])
    got = list(read_items(io.StringIO('plain first\n{"id": "x", "prompt": "json second"}\n')))
    assert got == [Item("1", 1, "plain first"), Item("x", 2, "json second")]


def test_a_json_string_may_hold_a_unicode_line_separator(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'\xef\xbb\xbf' + json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False).encode() + b"\n")
    assert list(read_items(f)) == [Item("1", 1, "a\u2028b")]  # the BOM does not make it plain text


def test_bad_lines_are_reported_with_their_line_and_the_others_come_through(tmp_path):
    rows = ['{"prompt": "ok"}', '{"prompt": "b"', '{"a": 1} [2]', '{"id": "m", "nope": 1}', '{"prompt": 3}',
            '{"id": true, "prompt": "c"}', '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "y"}]}', '{"prompt": "d", "max_tokens": 0}',
            '{"prompt": "e", "prediction": ["e"]}', '{"prompt": "last"}']
    f = tmp_path / "in.jsonl"
    f.write_bytes("\n".join(rows).encode() + b"\n\xff\xfe\n")
    got = list(read_items(str(f)))
    assert [(x.line, x.id) for x in got if isinstance(x, Item)] == [(1, "1"), (10, "10")]
    bad = {x.line: (x.id, x.error) for x in got if isinstance(x, BadLine)}
    assert bad[2][0] is None and bad[2][1].startswith("not JSON")
    assert bad[3][0] is None and bad[3][1].startswith("not JSON (Extra data)")
    assert bad[4][0] == "m" and '"prompt"' in bad[4][1] and '"messages"' in bad[4][1]
    assert bad[5] == ("5", '"prompt" must be a non-empty string')
    assert bad[6] == (None, '"id" must be a non-empty string or an integer')
    assert "ending with a user turn" in bad[7][1]
    assert bad[8] == ("8", '"max_tokens" must be at least 1 (got 0)')
    assert bad[9] == ("9", '"prediction" must be a string')
    assert bad[11] == (None, "not UTF-8 text")
    assert all("\n" not in error for _, error in bad.values())


@pytest.mark.parametrize("value, shown", [('"5"', '"5"'), ("5.0", "5.0"), ("true", "True"), ("[5]", "[5]"),
                                          ('{"n": 5}', "{'n': 5}"), ("NaN", "nan")])
def test_a_max_tokens_of_the_wrong_kind_is_refused_as_not_an_integer(value, shown):
    # Issue 44: "5" was reported as "must be at least 1 (got 5)", which reads as the number 5.
    got = list(read_items(io.StringIO(f'{{"prompt": "hi", "max_tokens": {value}}}\n')))
    assert got == [BadLine(1, "1", f'"max_tokens" must be an integer (got {shown})')]


def test_a_long_wrong_value_is_cut_in_the_message():  # one result line, not a copy of the megabyte
    got = list(read_items(io.StringIO(json.dumps({"prompt": "hi", "max_tokens": "9" * 100_000}) + "\n")))
    assert got[0].error.startswith('"max_tokens" must be an integer (got "999') and len(got[0].error) < 120


@pytest.mark.parametrize("line", ['{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}",
                                  '{"prompt": "hi", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_json_python_cannot_read_is_a_bad_line_and_the_next_still_runs(line):
    # An integer past Python's 4,300 digits (ValueError) or nesting past the recursion limit:
    # both once ended the whole run with a traceback.
    got = list(read_items(io.StringIO(line + '\n{"prompt": "next"}\n')))
    assert got[0] == BadLine(1, None, "JSON too large to read (a number too long, or nesting too deep)")
    assert got[1] == Item("2", 2, "next")


def test_a_duplicate_id_is_a_bad_line_the_first_one_runs():  # the id is the first one's, not its own
    stream = io.StringIO('{"id": "a", "prompt": "1"}\n{"id": "2", "prompt": "2"}\n{"prompt": "3"}\n'
                         '{"id": "a", "prompt": "4"}\n{"id": 2, "prompt": "5"}\n')
    got = list(read_items(stream))
    assert [x.id for x in got if isinstance(x, Item)] == ["a", "2", "3"]
    assert got[3] == BadLine(4, None, 'duplicate "id" "a", first on line 1')
    assert got[4] == BadLine(5, None, 'duplicate "id" "2", first on line 2')
    got = list(read_items(io.StringIO('{"id": 2, "prompt": "1"}\n{"prompt": "2"}\n')))
    assert got[1] == BadLine(2, None, 'duplicate "id" "2", first on line 1 (this line\'s id is its number)')


def test_a_missing_prompts_file_is_an_input_error_at_once(tmp_path):
    with pytest.raises(InputError, match="no such prompts file"):
        read_items(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="is a directory"):
        read_items(str(tmp_path))
    assert list(read_items(io.StringIO(""))) == [] and list(read_items(os.devnull)) == []  # not a regular file


def test_a_pipe_is_a_prompts_file_too(tmp_path):  # as <(...) or /dev/stdin would be
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("a\nb\n",))
    writer.start()
    assert [x.prompt for x in read_items(str(fifo))] == ["a", "b"]
    writer.join()


def results(*records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def done(out) -> set[str]:
    with ResultWriter(out) as w:
        return w.done


def test_resuming_cuts_a_half_written_last_line_and_keeps_every_complete_one(tmp_path):
    out = tmp_path / "out.jsonl"
    good = results({"id": "1", "text": "a"}, {"id": "2", "text": "b"}, {"id": "3", "text": "c"})
    out.write_bytes(good + b'{"id": "4", "text": "hal')
    assert done(out) == {"1", "2", "3"}
    assert out.read_bytes() == good
    assert done(out) == {"1", "2", "3"} and out.read_bytes() == good  # a second look changes nothing
    out.write_bytes(good + b'{"id": "4", "te\n')  # torn, yet ended by a newline: still cut
    assert done(out) == {"1", "2", "3"} and out.read_bytes() == good
    out.write_bytes(good + b"\0\0\0")  # what a power cut can leave
    assert done(out) == {"1", "2", "3"} and out.read_bytes() == good
    out.write_bytes(good + b'{"id": "4", "text": "d"}')  # whole, only its newline missing: kept
    assert done(out) == {"1", "2", "3", "4"}
    assert out.read_bytes() == good + b'{"id": "4", "text": "d"}\n'
    out.write_bytes(b'{"id": "1", "te')
    assert done(out) == set() and out.read_bytes() == b""
    assert done(os.devnull) == set()


ERRORS = [{"id": "1", "text": "a"}, {"id": "2", "line": 2, "error": "too long"},
          {"id": None, "line": 3, "error": "not JSON"}, {"id": None, "line": 3, "error": "not JSON"},
          {"id": "4", "line": 4, "error": "x"}, {"id": "4", "text": "retried"},
          {"id": None, "line": 9, "error": "not JSON"}, {"id": "other", "text": "another file's"}]


def test_a_rerun_skips_texts_and_identical_errors_and_takes_out_the_errors_it_replaces(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(results(*ERRORS))
    entries = [Item("1", 1, "a"), Item("2", 2, "b"), BadLine(3, None, "not JSON"), Item("4", 4, "d"),
               BadLine(5, None, "duplicate"), Item("9", 9, "fixed")]
    with ResultWriter(out) as w:
        assert w.done == {"1", "4", "other"}
        assert w.resume(entries) == [Item("2", 2, "b"), BadLine(5, None, "duplicate"), Item("9", 9, "fixed")]
        # Out: the errors of lines 2 and 9 (run again), the repeat of line 3's, the error of 4 (done).
        assert out.read_bytes() == results(*(ERRORS[i] for i in (0, 2, 5, 7)))
        w.write({"id": "2", "text": "b"})  # into the file that is there now
    assert out.read_bytes() == results(*(ERRORS[i] for i in (0, 2, 5, 7)), {"id": "2", "text": "b"})
    with ResultWriter(out) as w:  # nothing left to run or take out: the file as it was
        assert w.resume(entries[:4]) == [] and w.lines[-1].record == {"id": "2", "text": "b"}


def test_the_rewrite_replaces_the_file_a_link_points_to_and_keeps_its_mode(tmp_path):
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    real.write_bytes(results(*ERRORS))
    real.chmod(0o640)
    link.symlink_to(real)
    with ResultWriter(link) as w:
        w.resume([Item("2", 2, "b")])
    assert link.is_symlink() and real.read_bytes() == results(*(ERRORS[i] for i in (0, 2, 5, 6, 7)))
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.jsonl", "real.jsonl"]  # nothing left beside it


def test_a_rewrite_that_fails_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_bytes(results(*ERRORS))

    def full(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(batch_results.os, "replace", full)
    with ResultWriter(out) as w, pytest.raises(InputError, match="cannot rewrite .*No space left"):
        w.resume([Item("2", 2, "b")])
    assert out.read_bytes() == results(*ERRORS) and os.listdir(tmp_path) == ["out.jsonl"]


@pytest.mark.parametrize("junk", [b"not json\n", b"[1, 2]\n", b'{"text": "no id"}\n',
                                  b'{"id": "p1", "prompt": "a"}\n', b'{"id": 3, "text": "an int id"}\n',
                                  b'{"id": null, "text": "a"}\n'])
def test_a_file_that_is_not_results_is_refused_and_left_untouched(tmp_path, junk):
    out = tmp_path / "out.jsonl"
    before = results({"id": "1", "text": "a"}) + junk + results({"id": "3", "text": "c"}) + b'{"id": "4"'
    out.write_bytes(before)
    with pytest.raises(InputError, match=r"out\.jsonl:2: not a result line"):
        ResultWriter(out)
    assert out.read_bytes() == before
    out.write_bytes(b"my notes, no newline")  # a last line that is not ours is not cut either
    with pytest.raises(InputError, match=r"out\.jsonl:1"):
        ResultWriter(out)
    assert out.read_bytes() == b"my notes, no newline"
    out.write_bytes(results({"id": "1", "text": "a"}) + junk.rstrip())  # nor a whole last one, unended
    with pytest.raises(InputError, match=r"out\.jsonl:2"):
        ResultWriter(out)
    assert out.read_bytes() == results({"id": "1", "text": "a"}) + junk.rstrip()


def test_the_prompts_file_as_results_file_is_refused_under_any_name(tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    (tmp_path / "soft.jsonl").symlink_to(prompts)
    os.link(prompts, tmp_path / "hard.jsonl")
    for name in ("in.jsonl", "soft.jsonl", "hard.jsonl", "./../" + tmp_path.name + "/in.jsonl"):
        with pytest.raises(SettingError) as e:
            batch_results.check_output(str(prompts), str(tmp_path / name))
        assert e.value.param == "output"
    batch_results.check_output(str(prompts), str(tmp_path / "out.jsonl"))  # not there yet
    (tmp_path / "copy.jsonl").write_bytes(prompts.read_bytes())
    batch_results.check_output(str(prompts), str(tmp_path / "copy.jsonl"))  # a copy is refused later:
    with pytest.raises(InputError, match="copy.jsonl:1: not a result line"):  # its lines have no text
        ResultWriter(tmp_path / "copy.jsonl")


def test_the_writer_appends_whole_lines_and_never_glues_onto_a_torn_one(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(results({"id": "1", "text": "a"}) + b'{"id": "2", "te')
    with ResultWriter(str(out)) as w:
        w.write({"id": "2", "text": "héllo\nworld\u2028"})
        assert out.read_bytes().count(b"\n") == 2  # on disk before the writer is closed
        with pytest.raises(ValueError):
            w.write({"id": "3", "score": float("nan")})
    assert [json.loads(x) for x in out.read_bytes().split(b"\n")[:-1]] == [
        {"id": "1", "text": "a"}, {"id": "2", "text": "héllo\nworld\u2028"}]
    assert "héllo".encode() in out.read_bytes()  # ensure_ascii=False
    assert done(out) == {"1", "2"}


def test_the_writer_on_a_stream_writes_and_flushes_and_leaves_it_open(tmp_path, monkeypatch):
    stream = io.StringIO()
    with ResultWriter(stream) as w:
        w.write({"id": "1", "text": "ü"})
    assert stream.getvalue() == '{"id": "1", "text": "ü"}\n' and not stream.closed
    # A device (as /dev/stdout is) is neither locked (a terminal is shared) nor fsynced (it cannot be).
    calls = []
    monkeypatch.setattr(batch_results.os, "fsync", lambda fd: calls.append("fsync"))
    monkeypatch.setattr(batch_results.fcntl, "flock", lambda fd, how: calls.append("flock"))
    with ResultWriter(os.devnull) as w:
        w.write({"id": "1", "text": "a"})
        assert w.resume([Item("1", 1, "a")]) == [Item("1", 1, "a")]  # nothing to resume from
    assert calls == []
    with ResultWriter(tmp_path / "out.jsonl") as w:
        w.write({"id": "1", "text": "a"})
    assert calls == ["flock", "fsync", "fsync"]  # the repair's (of an empty file), the line's
    with pytest.raises(InputError, match="cannot write"):
        ResultWriter(tmp_path / "no" / "such" / "dir.jsonl")
    with pytest.raises(InputError, match="is a directory"):
        ResultWriter(tmp_path)


def test_a_second_run_on_the_same_results_file_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResultWriter(out) as w:
        w.write({"id": "1", "text": "a"})
        other = subprocess.run([sys.executable, "-c", "import sys; from specgen.api.prompts_file.results "
                                "import ResultWriter; ResultWriter(sys.argv[1])", str(out)],
                               capture_output=True, text=True)
        assert other.returncode != 0 and "being written by another specgen run" in other.stderr
    assert done(out) == {"1"}  # the lock went with the writer


def test_bench_prompt_files_read_through_the_same_rows(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": CHAT, "set": "chat"}) + "\n\n" + json.dumps({"prompt": "b"}) + "\n")
    assert read_prompt_file(str(f)) == {"chat": [CHAT], "custom": ["b"]}
    f.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    with pytest.raises(InputError, match=r'p\.jsonl:2: "prompt" must be a non-empty string'):
        read_prompt_file(str(f))
    f.write_text("\n\n")
    with pytest.raises(InputError, match="holds no prompts"):
        read_prompt_file(str(f))
    with pytest.raises(InputError, match="no such prompts file"):
        read_prompt_file(str(tmp_path / "missing.txt"))


def test_a_results_file_deleted_mid_run_is_written_again_with_every_result(tmp_path):
    # The writer went on into the deleted file: "120 prompts done", exit 0, results nowhere.
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"id": "earlier", "text": "kept"}) + "\n")
    with ResultWriter(path) as out:
        out.write({"id": "a", "text": "one"})
        path.unlink()
        out.write({"id": "b", "text": "two"})
        out.write({"id": "c", "text": "three"})
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == ["earlier", "a", "b", "c"]


def test_a_results_file_replaced_mid_run_stops_the_run_naming_it_and_is_left_alone(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResultWriter(path) as out:
        out.write({"id": "a", "text": "one"})
        path.unlink()
        path.write_text("the user's own file\n")
        with pytest.raises(InputError, match=f"{path} was replaced by another file"):
            out.write({"id": "b", "text": "two"})
    assert path.read_text() == "the user's own file\n"
