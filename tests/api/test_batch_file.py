"""api/batch_file.py without a model: reading a prompts file or stream, resuming from a results
file (a line torn by a kill cut off, everything else kept), and writing results as durable lines."""

import io
import json
import os
import subprocess
import sys
import threading

import pytest

from specgen.api.batch_file import BadLine, Item, ResultWriter, done_ids, read_items
from specgen.cli.bench import read_prompt_file
from specgen.errors import InputError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_jsonl_rows_ids_default_to_line_numbers_and_extra_fields_come_through(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([json.dumps({"prompt": "a"}), "",
                            json.dumps({"id": "x", "messages": CHAT, "set": "ignored"}),
                            json.dumps({"id": 7, "prompt": "b", "prediction": "b!", "max_tokens": 5})]) + "\n")
    assert list(read_items(str(f))) == [Item("1", 1, "a"), Item("x", 3, CHAT), Item("7", 4, "b", "b!", 5)]


def test_plain_text_lines_from_a_stream_keep_their_line_numbers():
    stream = io.StringIO("Once upon a time\n\n  \n{not the first line, so a prompt}\r\nlast")
    assert list(read_items(stream)) == [Item("1", 1, "Once upon a time"),
                                        Item("4", 4, "{not the first line, so a prompt}"), Item("5", 5, "last")]


def test_a_json_string_may_hold_a_unicode_line_separator(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'\xef\xbb\xbf' + json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False).encode() + b"\n")
    assert list(read_items(f)) == [Item("1", 1, "a\u2028b")]  # the BOM does not make it plain text


def test_bad_lines_are_reported_with_their_line_and_the_others_come_through(tmp_path):
    rows = ['{"prompt": "ok"}', '"prompt": "b"}', "[1, 2]", '{"id": "m", "nope": 1}', '{"prompt": 3}',
            '{"id": true, "prompt": "c"}', '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "y"}]}', '{"prompt": "d", "max_tokens": 0}',
            '{"prompt": "e", "prediction": ["e"]}', '{"prompt": "last"}']
    f = tmp_path / "in.jsonl"
    f.write_bytes("\n".join(rows).encode() + b"\n\xff\xfe\n")
    got = list(read_items(str(f)))
    assert [(x.line, x.id) for x in got if isinstance(x, Item)] == [(1, "1"), (10, "10")]
    bad = {x.line: (x.id, x.error) for x in got if isinstance(x, BadLine)}
    assert bad[2][0] is None and bad[2][1].startswith("not JSON")
    assert bad[3] == (None, "expected a JSON object")
    assert bad[4][0] == "m" and '"prompt"' in bad[4][1] and '"messages"' in bad[4][1]
    assert bad[5] == ("5", '"prompt" must be a non-empty string')
    assert bad[6] == (None, '"id" must be a non-empty string or an integer')
    assert "ending with a user turn" in bad[7][1]
    assert bad[8] == ("8", '"max_tokens" must be at least 1 (got 0)')
    assert bad[9] == ("9", '"prediction" must be a string')
    assert bad[11] == (None, "not UTF-8 text")
    assert all("\n" not in error for _, error in bad.values())


def test_a_duplicate_id_is_a_bad_line_the_first_one_runs():
    stream = io.StringIO('{"id": "a", "prompt": "1"}\n{"id": "2", "prompt": "2"}\n{"prompt": "3"}\n'
                         '{"id": "a", "prompt": "4"}\n{"id": 2, "prompt": "5"}\n')
    got = list(read_items(stream))
    assert [x.id for x in got if isinstance(x, Item)] == ["a", "2", "3"]
    assert got[3] == BadLine(4, "a", 'duplicate "id" "a", first on line 1')
    assert got[4] == BadLine(5, "2", 'duplicate "id" "2", first on line 2')
    got = list(read_items(io.StringIO('{"id": 2, "prompt": "1"}\n{"prompt": "2"}\n')))
    assert got[1] == BadLine(2, "2", 'duplicate "id" "2", first on line 1 (this line\'s id is its number)')


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


def test_resuming_cuts_a_half_written_last_line_and_keeps_every_complete_one(tmp_path):
    out = tmp_path / "out.jsonl"
    good = results({"id": "1", "text": "a"}, {"id": "2", "text": "b"}, {"id": "3", "text": "c"})
    out.write_bytes(good + b'{"id": "4", "text": "hal')
    assert done_ids(out) == {"1", "2", "3"}
    assert out.read_bytes() == good
    assert done_ids(out) == {"1", "2", "3"} and out.read_bytes() == good  # a second look changes nothing
    out.write_bytes(good + b'{"id": "4", "te\n')  # torn, yet ended by a newline: still cut
    assert done_ids(out) == {"1", "2", "3"} and out.read_bytes() == good
    out.write_bytes(good + b"\0\0\0")  # what a power cut can leave
    assert done_ids(out) == {"1", "2", "3"} and out.read_bytes() == good
    out.write_bytes(good + b'{"id": "4", "text": "d"}')  # whole, only its newline missing: kept
    assert done_ids(out) == {"1", "2", "3", "4"}
    assert out.read_bytes() == good + b'{"id": "4", "text": "d"}\n'
    out.write_bytes(b'{"id": "1", "te')
    assert done_ids(out) == set() and out.read_bytes() == b""
    assert done_ids(tmp_path / "missing.jsonl") == set() and not (tmp_path / "missing.jsonl").exists()
    assert done_ids(os.devnull) == set()


def test_error_results_are_not_done_so_a_rerun_retries_them(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(results({"id": "1", "text": "a"}, {"id": "2", "error": "too long"},
                            {"id": None, "line": 3, "error": "not JSON"}, {"id": "4", "error": "x"},
                            {"id": "4", "text": "retried"}))
    assert done_ids(out) == {"1", "4"}


@pytest.mark.parametrize("junk", [b"not json\n", b"[1, 2]\n", b'{"text": "no id"}\n'])
def test_a_file_that_is_not_results_is_refused_and_left_untouched(tmp_path, junk):
    out = tmp_path / "out.jsonl"
    before = results({"id": "1", "text": "a"}) + junk + results({"id": "3", "text": "c"}) + b'{"id": "4"'
    out.write_bytes(before)
    with pytest.raises(InputError, match=r"out\.jsonl:2: not a result line"):
        done_ids(out)
    assert out.read_bytes() == before
    out.write_bytes(b"my notes, no newline")  # a last line that is not ours is not cut either
    with pytest.raises(InputError, match=r"out\.jsonl:1"):
        done_ids(out)
    with pytest.raises(InputError, match=r"out\.jsonl:1"):
        ResultWriter(out)
    assert out.read_bytes() == b"my notes, no newline"
    out.write_bytes(results({"id": "1"}) + junk)  # a whole last line that is not ours is not cut
    with pytest.raises(InputError, match=r"out\.jsonl:2"):
        done_ids(out)
    assert out.read_bytes() == results({"id": "1"}) + junk


def test_the_writer_appends_whole_lines_and_never_glues_onto_a_torn_one(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(results({"id": "1", "text": "a"}) + b'{"id": "2", "te')
    with ResultWriter(str(out)) as w:  # without done_ids first: it cuts the torn line itself
        w.write({"id": "2", "text": "héllo\nworld\u2028"})
        assert out.read_bytes().count(b"\n") == 2  # on disk before the writer is closed
        with pytest.raises(ValueError):
            w.write({"id": "3", "score": float("nan")})
    assert [json.loads(x) for x in out.read_bytes().split(b"\n")[:-1]] == [
        {"id": "1", "text": "a"}, {"id": "2", "text": "héllo\nworld\u2028"}]
    assert "héllo".encode() in out.read_bytes()  # ensure_ascii=False
    assert done_ids(out) == {"1", "2"}


def test_the_writer_on_a_stream_writes_and_flushes_and_leaves_it_open(tmp_path):
    stream = io.StringIO()
    with ResultWriter(stream) as w:
        w.write({"id": "1", "text": "ü"})
    assert stream.getvalue() == '{"id": "1", "text": "ü"}\n' and not stream.closed
    with ResultWriter(os.devnull) as w:  # a device (as /dev/stdout is) is neither locked nor fsynced
        w.write({"id": "1"})
    with pytest.raises(InputError, match="cannot write"):
        ResultWriter(tmp_path / "no" / "such" / "dir.jsonl")


def test_a_second_run_on_the_same_results_file_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResultWriter(out) as w:
        w.write({"id": "1", "text": "a"})
        other = subprocess.run([sys.executable, "-c", "import sys; from specgen.api.batch_file import done_ids; "
                                "done_ids(sys.argv[1])", str(out)], capture_output=True, text=True)
        assert other.returncode != 0 and "being written by another specgen run" in other.stderr
    assert done_ids(out) == {"1"}  # the lock went with the writer


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
