"""Keys, headers, message builders and the drop-in's pure parts (no broker)."""

import pyarrow as pa
import pytest

import hintstream
from hintstream import apply_hint, build_trajectories, group_key, parse_group_key, parse_step_key, step_key
from hintstream.keys import decode_id, encode_id
from hintstream.wire import ChunkInfo, Topics, chunk_info, read_ipc_stream, ipc_stream, scored_chunks, scored_rows, scored_step_table, scored_table, table_chunks
from vectors import shared_vectors


def test_ids_without_percent_or_slash_keep_their_keys() -> None:
    assert group_key("run-1", 12, "swe-task-7") == "run-1/12/swe-task-7"
    assert step_key("run-1", 12) == "run-1/12"


def test_percent_and_slash_are_encoded_and_nothing_else() -> None:
    assert encode_id("a/b%c d+é%2F") == "a%2Fb%25c d+é%252F"
    assert group_key("org/run%1", 3, "repo/issue-9") == "org%2Frun%251/3/repo%2Fissue-9"
    assert step_key("org/run%1", 3) == "org%2Frun%251/3"
    # Different ids never share a key.
    assert group_key("a/b", 1, "c") != group_key("a", 1, "b/c")


@pytest.mark.parametrize("value", ["", "plain", "a/b", "%", "%2F", "%25", "/%/", "x%2fy", "é/ü%"])
def test_decode_inverts_encode(value: str) -> None:
    assert decode_id(encode_id(value)) == value


def test_keys_parse_back() -> None:
    assert parse_group_key(group_key("r/1", 5, "i%2")) == ("r/1", 5, "i%2")
    assert parse_step_key(step_key("r/1%", 7)) == ("r/1%", 7)
    assert decode_id("a%2fb") == "a/b"
    for bad in ["r", "r/x", "a/b/1/", "/1"]:
        with pytest.raises(ValueError):
            parse_step_key(bad)


def test_chunk_headers() -> None:
    assert chunk_info(None) == ChunkInfo(0, 1, None)
    assert chunk_info([("content-type", b"x"), ("hintstream.rows", b"7")]) == ChunkInfo(0, 1, 7)
    assert chunk_info([("hintstream.chunk", b"2"), ("hintstream.chunks", b"3"), ("hintstream.rows", b"100")]) == ChunkInfo(2, 3, 100)
    for bad in (
        [("hintstream.chunk", b"3"), ("hintstream.chunks", b"3")],
        [("hintstream.chunk", b"0")],
        [("hintstream.chunk", b"-1"), ("hintstream.chunks", b"3")],
        [("hintstream.chunk", b"x"), ("hintstream.chunks", b"3")],
    ):
        with pytest.raises(ValueError):
            chunk_info(bad)


def test_topics() -> None:
    assert Topics.of(None).failed == "rl.trajectories.failed"
    assert Topics.of({"hints": "h"}).hints == "h"
    with pytest.raises(ValueError):
        Topics.of({"hint": "h"})


def test_scored_arrow_round_trip() -> None:
    rows = scored_rows("r", 2, [{"instance_id": "g", "trajectory_id": "t", "reward": 0.1, "is_hinted": True, "hint_category": "llm_synthesized"}])
    table = read_ipc_stream(ipc_stream(scored_table(rows)))
    assert table.column("reward").type == pa.float64()
    assert table.column("reward").to_pylist() == [0.1]
    assert table.column("instance_id").type == pa.dictionary(pa.int32(), pa.string())


def test_apply_hint_is_the_reference_template() -> None:
    assert apply_hint("Fix it.", "Run the tests.") == "Fix it.\n\nHere is feedback from a previous attempt to help you:\nRun the tests."
    assert apply_hint("Fix it.", "") == "Fix it."


def test_each_request_is_its_own_group() -> None:
    requests = [
        {"task_prompt": "a", "instance_id": "g1"},
        {"task_prompt": "b", "instance_id": "g1"},
        {"task_prompt": "c", "instance_id": "g1#1"},
        {"task_prompt": "d"},
        {"task_prompt": "e", "instance_id": "g2", "chat_history": [{"role": "assistant", "content": None}, {"role": "tool", "content": [{"type": "text", "text": "x"}, "raw"]}]},
    ]
    ts = build_trajectories(requests, "run", 4)
    ids = [t["instance_id"] for t in ts]
    assert ids[0] == "g1" and ids[4] == "g2"
    assert len(set(ids)) == 5, ids
    assert len({t["trajectory_id"] for t in ts}) == 5
    assert all(t["reward"] == 0.0 and t["group_size"] == 1 and t["schema_version"] == 1 for t in ts)
    assert ts[4]["chat_history"] == [
        {"role": "assistant", "content": "None"},
        {"role": "tool", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "raw"}]},
    ]


def test_public_names() -> None:
    for name in hintstream.__all__:
        assert hasattr(hintstream, name), name


def test_a_big_step_is_cut_into_arrow_messages_under_the_limit_in_row_order() -> None:
    rows = [
        {"instance_id": f"swe-task-{(i * 7919) % 5000:08}", "trajectory_id": f"traj-{i}", "reward": (i % 10) / 10, "is_hinted": i % 9 == 0}
        for i in range(40_000)
    ]
    messages = scored_rows("run", 3, rows)
    assert len(ipc_stream(scored_table(messages))) > 200_000
    chunks = scored_chunks(messages, 200_000)
    assert len(chunks) > 1
    assert all(len(c) <= 200_000 for c in chunks)
    tables = [read_ipc_stream(c) for c in chunks]
    assert [t for table in tables for t in table.column("trajectory_id").to_pylist()] == [m["trajectory_id"] for m in messages]
    # Each chunk carries only its own rows' ids in its dictionary.
    for table in tables:
        column = table.column("instance_id").combine_chunks()
        assert len(column.dictionary) <= table.num_rows
    # A step that fits stays one message; a row that cannot fit is refused.
    assert len(scored_chunks(messages[:10], 200_000)) == 1
    assert scored_chunks([], 200_000) == []
    with pytest.raises(ValueError, match="alone encodes"):
        scored_chunks(messages[:100], 100)


def test_log_probs_are_checked_and_go_on_the_arrow_table() -> None:
    base = {"instance_id": "g", "trajectory_id": "t", "reward": 1.0, "is_hinted": True}
    rows = scored_rows("r", 1, [{**base, "logprob_hinted": -5.0, "logprob_unhinted": -25.0, "response_length": 10}, base])
    assert (rows[0]["logprob_hinted"], rows[0]["logprob_unhinted"]) == (-5.0, -25.0)
    assert "logprob_hinted" not in rows[1]
    table = scored_table(rows)
    assert table.column("logprob_hinted").type == pa.float64()
    assert table.column("logprob_unhinted").to_pylist() == [-25.0, None]
    for bad, text in [
        ({"logprob_hinted": 0.5, "response_length": 2}, "at most 0"),
        ({"logprob_unhinted": float("nan"), "response_length": 2}, "finite"),
        ({"logprob_hinted": -1.0}, "no response_length"),
        ({"logprob_unhinted": True, "response_length": 2}, "bool"),
    ]:
        with pytest.raises(ValueError, match=text):
            scored_rows("r", 1, [{**base, **bad}])
    # 1e-6 of rounding is accepted.
    assert scored_rows("r", 1, [{**base, "logprob_hinted": 1e-6, "response_length": 1}])[0]["logprob_hinted"] == 1e-6


def test_a_step_table_is_the_table_of_its_scored_rows_messages() -> None:
    # Every optional field on some rows and not others, ids and rewards
    # that need converting, and steps with none of the optional columns.
    rows = [
        {"instance_id": 7, "trajectory_id": "t-0", "reward": 1, "is_hinted": 0},
        {"instance_id": "g", "trajectory_id": "t-1", "reward": "0.5", "is_hinted": True, "hint_category": "wrong_file", "hint_id": 12, "response_length": 3.0},
        {"instance_id": "g", "trajectory_id": "t-2", "reward": -0.0, "is_hinted": True, "hint_id": "h", "response_length": 4, "logprob_hinted": -1.5, "logprob_unhinted": -2},
        {"instance_id": "é/%", "trajectory_id": "t-3", "reward": 0.25, "is_hinted": False, "hint_category": None, "logprob_unhinted": -0.5, "response_length": 1},
    ]
    for chosen in (rows, rows[:1], [rows[0], rows[3]], []):
        table = scored_step_table("run/1", 4, chosen)
        assert table.equals(scored_table(scored_rows("run/1", 4, chosen)))
        assert table.num_rows == len(chosen)
    whole = scored_step_table("run", 4, rows)
    limits = (100_000, len(ipc_stream(whole)) - 1)
    chunks = [table_chunks(whole, n) for n in limits]
    assert [len(c) for c in chunks][0] == 1 and len(chunks[1]) > 1
    assert chunks == [scored_chunks(scored_rows("run", 4, rows), n) for n in limits]
    # scored_table of messages is as strict as it was: a missing field
    # raises, any Mapping does, and a response_length of 0 or none is 1.
    messages = scored_rows("run/1", 4, rows)
    with pytest.raises(KeyError):
        scored_table([{k: v for k, v in messages[0].items() if k != "instance_id"}])
    from types import MappingProxyType

    assert scored_table([MappingProxyType(m) for m in messages]).equals(scored_step_table("run/1", 4, rows))
    lengths = scored_table([{**messages[0], "response_length": 0}, messages[1]]).column("response_length").to_pylist()
    assert lengths == [1, 3]
    # The rows may be any iterable, read once.
    assert scored_step_table("run/1", 4, iter(rows)).equals(scored_step_table("run/1", 4, rows))


def test_a_step_table_refuses_what_scored_rows_refuses_with_the_same_words() -> None:
    base = {"instance_id": "g", "trajectory_id": "t", "reward": 1.0, "is_hinted": True}
    bad_rows = [
        {"instance_id": "g", "reward": 1.0, "is_hinted": True},
        {**base, "instance_id": " "},
        {**base, "trajectory_id": ""},
        {**base, "reward": float("nan")},
        {**base, "reward": float("-inf")},
        {**base, "hint_id": "\t"},
        {**base, "response_length": 0},
        {**base, "response_length": 2.5},
        {**base, "logprob_hinted": -1.0},
        {**base, "logprob_unhinted": 0.5, "response_length": 2},
    ]
    for bad in bad_rows:
        with pytest.raises(ValueError) as by_messages:
            scored_rows("r", 1, [base, bad])
        with pytest.raises(ValueError) as by_columns:
            scored_step_table("r", 1, [base, bad])
        assert str(by_columns.value) == str(by_messages.value)
        assert "scored row 1 " in str(by_columns.value)
    for run_id, step in ((" ", 1), ("r", -1)):
        with pytest.raises(ValueError) as by_messages:
            scored_rows(run_id, step, [base])
        with pytest.raises(ValueError) as by_columns:
            scored_step_table(run_id, step, [base])
        assert str(by_columns.value) == str(by_messages.value)


def test_an_id_is_blank_as_the_shared_vectors_say() -> None:
    from hintstream.dropin import _wire_instance_ids
    from hintstream.wire import blank, check_failed, failed_trajectory

    vectors = shared_vectors("blank.json")
    assert len(vectors["cases"]) >= 10
    base = {"instance_id": "g", "trajectory_id": "t", "reward": 1.0, "is_hinted": True, "hint_id": "h"}
    for case in vectors["cases"]:
        text, want = case["text"], case["blank"]
        assert blank(text) is want, case["case"]
        # The drop-in keeps a request's own group id unless it is blank.
        assert _wire_instance_ids([{"instance_id": text}]) == (["request#0"] if want else [text])
        # Every check of an id before anything is sent follows it.
        for name in ("instance_id", "trajectory_id", "hint_id"):
            for check in (scored_rows, scored_step_table):
                if want:
                    with pytest.raises(ValueError, match=f"blank {name}"):
                        check("r", 1, [{**base, name: text}])
                else:
                    check("r", 1, [{**base, name: text}])
        message = failed_trajectory(run_id="r", step=1, instance_id="i", task_prompt="p", chat_history_messages=[], reward=0.0, group_size=1)
        if want:
            with pytest.raises(ValueError, match="trajectory_id"):
                check_failed({**message, "trajectory_id": text})
            with pytest.raises(ValueError, match="run_id"):
                scored_rows(text, 1, [base])
        else:
            check_failed({**message, "trajectory_id": text})
            scored_step_table(text, 1, [base])


def test_a_repeated_trajectory_id_is_named_by_its_first_place_either_way() -> None:
    from hintstream.client import _refuse_repeated_ids

    for ids in (["a", "b", "b", "a"], pa.chunked_array([["a", "b"], ["b", "a"]])):
        with pytest.raises(ValueError, match="'a' appears twice in step 3"):
            _refuse_repeated_ids(ids, 3)
    for ids in (["a", "b"], pa.array(["a", "b"]), []):
        _refuse_repeated_ids(ids, 3)


def test_ratio_and_reliance_are_stage_2s() -> None:
    import math

    from hintstream.wire import ratio, reliance

    assert ratio(-5.0, -25.0, 10) == math.exp(-2.0) and reliance(-5.0, -25.0, 10) == 2.0
    assert ratio(-30.0, -10.0, 4) == 1.0 and reliance(-30.0, -10.0, 4) == -5.0
    assert ratio(0.0, -1.7e308, 1) == 0.0
