"""`kvplan profile` on the field's CSV traces (Azure's 2023 and 2024 LLM inference traces, BurstGPT
before and after its Session ID / Elapsed time columns) and on any CSV or JSONL read through
`--columns`: each small file's arrival offsets, lengths, sessions, failed rows and format name
worked out by hand, and one line with exit 2 for each bad input."""

import calendar
import json
from pathlib import Path

import pytest

from kvplan.profile.columns import ColumnMap, iso_seconds, parse_columns
from kvplan.profile.csv_traces import read_trace
from tests.kvplan.cli_runner import run_cli

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def profile_json(*args: str) -> tuple[dict, str]:
    code, out, err = run_cli("profile", *args, "--model", "tiny-random-llama", "--json")
    assert code == 0, err
    return json.loads(out), err


def one_error_line(*args: str) -> str:
    code, out, err = run_cli("profile", *args, "--model", "tiny-random-llama")
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def offsets(path: Path, **kwargs) -> list[float]:
    requests = read_trace(path, **kwargs).requests
    return [r.arrival_s - requests[0].arrival_s for r in requests]


def test_an_azure_2023_trace_keeps_its_seven_fractional_digits(tmp_path):
    # the 2023 trace's own first two rows (data/AzureLLMInferenceTrace_code.csv), then one of 1.5200401 s later
    log = write(
        tmp_path / "AzureLLMInferenceTrace_code.csv",
        AZURE_HEADER,
        "2023-11-16 18:17:03.9799600,4808,10",
        "2023-11-16 18:17:04.0319600,3180,8",
        "2023-11-16 18:17:05.5000001,110,27",
    )
    parsed = read_trace(log)
    assert parsed.log_format == "azure" and parsed.num_failed == 0 and parsed.bad_lines == ()
    # no offset: UTC; 18:17:03 on 2023-11-16 as the epoch's seconds, by the calendar, not by datetime
    assert parsed.requests[0].arrival_s == pytest.approx(calendar.timegm((2023, 11, 16, 18, 17, 3)) + 0.97996, abs=1e-6)
    assert offsets(log) == pytest.approx([0.0, 0.052, 1.5200401], abs=1e-6)
    assert [(r.input_tokens, r.output_tokens) for r in parsed.requests] == [(4808, 10), (3180, 8), (110, 27)]
    assert all(r.token_ids is None and r.cached_tokens is None and r.finish_s is None for r in parsed.requests)
    data, err = profile_json(str(log))
    assert data["log_format"] == "azure" and data["formats"] == {"azure": 3}
    assert data["num_requests"] == 3 and data["num_bad_lines"] == 0 and data["num_failed_requests"] == 0
    assert data["duration_s"] == pytest.approx(1.5200401, abs=1e-6)
    assert data["arrival"]["rate_per_s"] == pytest.approx(2 / 1.5200401, rel=1e-6)
    assert data["input_tokens"]["max"] == 4808 and data["input_tokens"]["p50"] == 3180
    assert data["output_tokens"]["p50"] == 10 and data["prefix_reuse"] == 0 and data["turns"] is None
    assert "azure rows carry no token ids: their prefix reuse is unknown" in err
    code, out, _ = run_cli("profile", str(log), "--model", "tiny-random-llama")
    assert code == 0 and "log format" in out and "azure" in out


def test_the_seventh_fractional_digit_is_read_not_cut():
    # datetime keeps microseconds (six digits); a seven-digit fraction's last digit is 1e-7 s
    assert iso_seconds("1970-01-01 00:00:00.0000001", "TIMESTAMP") == pytest.approx(1e-7, rel=1e-9)
    assert iso_seconds("1970-01-01T00:00:01.123456789Z", "t") == pytest.approx(1.123456789, rel=1e-12)


def test_an_azure_2024_trace_reads_its_offsets_and_times_without_a_fraction(tmp_path):
    # 2024: +00:00 on every time, six fractional digits or none (AzureLLMInferenceDataset2024.ipynb)
    log = write(
        tmp_path / "AzureLLMInferenceTrace_conv_1week.csv",
        AZURE_HEADER,
        "2024-05-10 02:00:02.5+02:00,76,15",  # 00:00:02.5 UTC: third by arrival
        "2024-05-10 00:00:00.009930+00:00,2162,5",
        "2024-05-10 00:00:01+00:00,2399,6",
        "2024-05-10T00:00:03Z,7670,8",
    )
    parsed = read_trace(log)
    assert parsed.log_format == "azure" and [r.line for r in parsed.requests] == [3, 4, 2, 5]
    assert parsed.requests[0].arrival_s == pytest.approx(calendar.timegm((2024, 5, 10, 0, 0, 0)) + 0.00993, abs=1e-6)
    assert offsets(log) == pytest.approx([0.0, 0.99007, 2.49007, 2.99007], abs=1e-6)
    assert [r.input_tokens for r in parsed.requests] == [2162, 2399, 76, 7670]
    data, _ = profile_json(str(log))
    assert data["log_format"] == "azure" and data["num_requests"] == 4
    assert data["duration_s"] == pytest.approx(2.99007, abs=1e-6)
    assert data["output_tokens"]["max"] == 15


def test_burstgpt_leaves_its_failed_rows_out_and_counts_them(tmp_path):
    # the release v1.1 columns; the third row's 0 response tokens are a failed request
    log = write(
        tmp_path / "BurstGPT_1.csv",
        BURSTGPT_HEADER,
        "5,ChatGPT,472,18,490,Conversation log",
        "45,ChatGPT,1087,230,1317,Conversation log",
        "118,GPT-4,417,0,417,Conversation log",
        "185,ChatGPT,1360,647,2007,API log",
    )
    parsed = read_trace(log)
    assert parsed.log_format == "burstgpt" and parsed.num_failed == 1 and parsed.bad_lines == ()
    assert [r.arrival_s for r in parsed.requests] == [5.0, 45.0, 185.0]  # s from the trace's start
    assert [r.line for r in parsed.requests] == [2, 3, 5]
    data, err = profile_json(str(log))
    assert data["num_requests"] == 3 and data["num_failed_requests"] == 1 and data["num_bad_lines"] == 0
    assert data["log_format"] == "burstgpt" and data["formats"] == {"burstgpt": 3}
    assert data["duration_s"] == 180.0 and data["arrival"]["rate_per_s"] == pytest.approx(2 / 180)
    assert data["input_tokens"]["p50"] == 1087 and data["output_tokens"]["max"] == 647
    assert data["turns"] is None and data["in_flight"] is None
    assert "1 failed request (Response tokens 0) left out" in err
    code, out, _ = run_cli("profile", str(log), "--model", "tiny-random-llama")
    assert code == 0 and "failed requests" in out


@pytest.mark.parametrize("session", ["Session ID", "SessionID"])
def test_burstgpt_sessions_and_elapsed_time_give_turns_and_requests_in_flight(tmp_path, session):
    # release v2.0: Session ID (conversation rows only) and Elapsed time (s), in an order of their own
    log = write(
        tmp_path / "BurstGPT_3.csv",
        f"Timestamp,{session},Model,Request tokens,Response tokens,Total tokens,Log Type,Elapsed time",
        "10,s1,ChatGPT,100,20,120,Conversation log,2.5",
        "12,,ChatGPT,50,5,55,API log,1.0",
        "20,s1,ChatGPT,200,30,230,Conversation log,4.0",
        "30,s2,GPT-4,80,0,80,Conversation log,0.5",
        "31,s2,GPT-4,90,10,100,Conversation log,1.5",
    )
    parsed = read_trace(log)
    assert parsed.num_failed == 1
    assert [(r.arrival_s, r.finish_s, r.session) for r in parsed.requests] == [
        (10.0, 12.5, "s1"),
        (12.0, 13.0, None),
        (20.0, 24.0, "s1"),
        (31.0, 32.5, "s2"),
    ]
    data, _ = profile_json(str(log))
    assert data["num_requests"] == 4 and data["num_failed_requests"] == 1
    # sessions s1 (2 turns), the API row alone, s2 (1 turn left after its failed row): 4 / 3, at most 2
    assert data["turns"] == {"mean": pytest.approx(4 / 3), "max": 2} and data["turns_source"] == "session_id"
    # [10, 12.5) and [12, 13) overlap; time-weighted mean (2.5 + 1 + 4 + 1.5) / (32.5 - 10)
    assert data["in_flight"] == {"peak": 2, "mean": pytest.approx(9 / 22.5), "num_requests": 4}


def test_a_mapped_csv_with_ms_timestamps_and_latencies(tmp_path):
    log = write(
        tmp_path / "requests.csv",
        "time_ms,prompt,completion,conv,lat",
        "1000,10,5,a,500",
        "1250,20,6,b,250",
        "3000,30,7,a,1000",
    )
    columns = "timestamp=time_ms,input_tokens=prompt,output_tokens=completion,session=conv,latency=lat"
    parsed = read_trace(log, columns=parse_columns(columns, "ms"))
    assert parsed.log_format == "mapped"
    assert [(r.arrival_s, r.finish_s, r.session) for r in parsed.requests] == [
        (1.0, 1.5, "a"),
        (1.25, 1.5, "b"),
        (3.0, 4.0, "a"),
    ]
    data, _ = profile_json(str(log), "--columns", columns, "--time-unit", "ms")
    assert data["log_format"] == "mapped" and data["formats"] == {"mapped": 3} and data["num_requests"] == 3
    assert data["duration_s"] == 2.0 and data["arrival"]["rate_per_s"] == 1.0
    assert data["turns"] == {"mean": 1.5, "max": 2}
    assert data["in_flight"] == {"peak": 2, "mean": pytest.approx(1.75 / 3), "num_requests": 3}
    assert data["input_tokens"]["p50"] == 20 and data["output_tokens"]["max"] == 7
    # the same columns in seconds (the default unit): a thousand times longer
    data, _ = profile_json(str(log), "--columns", columns)
    assert data["duration_s"] == 2000.0


def test_a_mapped_csv_with_iso_times_of_any_precision_and_a_finish_column(tmp_path):
    log = write(
        tmp_path / "spans.csv",
        "start,end,in,out",
        "2024-01-01T00:00:00.123456789Z,2024-01-01T00:00:01.123456789Z,5,1",
        "2024-01-01 00:00:02,2024-01-01 00:00:02.5,6,2",  # no offset: UTC
        "2024-01-01T01:00:04.5+01:00,2024-01-01T00:00:05Z,7,3",  # 00:00:04.5 UTC
    )
    columns = parse_columns("timestamp=start,finish=end,input_tokens=in,output_tokens=out")
    parsed = read_trace(log, columns=columns)
    first = parsed.requests[0].arrival_s
    assert first == pytest.approx(calendar.timegm((2024, 1, 1, 0, 0, 0)) + 0.123456789, abs=1e-6)
    assert offsets(log, columns=columns) == pytest.approx([0.0, 1.876543211, 4.376543211], abs=1e-6)
    assert [r.finish_s - r.arrival_s for r in parsed.requests] == pytest.approx([1.0, 0.5, 0.5], abs=1e-6)
    data, _ = profile_json(str(log), "--columns", "timestamp=start,finish=end,input_tokens=in,output_tokens=out")
    assert data["log_format"] == "mapped" and data["duration_s"] == pytest.approx(4.376543211, abs=1e-6)
    assert data["peak_in_flight"] == 1


def test_a_jsonl_log_read_through_columns(tmp_path):
    log = tmp_path / "custom.jsonl"
    log.write_text(
        json.dumps({"t": 1.5, "n_in": 3, "n_out": 4, "user": 7})
        + "\n"
        + json.dumps({"t": "4.0", "n_in": "8", "n_out": 2.0, "user": 7})
        + "\n"
        + json.dumps({"t": 5, "n_out": 1})
        + "\n"
    )
    data, _ = profile_json(str(log), "--columns", "timestamp=t,input_tokens=n_in,output_tokens=n_out,session=user")
    assert data["log_format"] == "mapped" and data["num_requests"] == 2 and data["duration_s"] == 2.5
    assert data["bad_lines"] == ["line 3: n_in: missing"] and data["turns"] == {"mean": 2.0, "max": 2}


def test_a_jsonl_log_names_the_format_its_first_line_has(tmp_path):
    log = tmp_path / "trace.jsonl"
    log.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 3}) + "\n")
    data, _ = profile_json(str(log))
    assert data["log_format"] == "mooncake" and data["num_failed_requests"] == 0


def test_a_parsed_column_map_holds_what_was_given():
    columns = parse_columns(" timestamp = TIME , input_tokens=Request tokens,output_tokens=out", "us")
    assert columns == ColumnMap("TIME", "Request tokens", "out", time_unit="us")


# bad input: one line naming the line and the column, exit 2; a bad row beside good ones is a bad line


def test_an_unknown_csv_header_is_one_line_listing_the_known_formats(tmp_path):
    log = write(tmp_path / "other.csv", "time,in,out", "1,2,3")
    line = one_error_line(str(log))
    assert line.startswith(f"error: {log}: line 1: header: names no trace format kvplan knows (time, in, out); ")
    assert "azure: TIMESTAMP, ContextTokens, GeneratedTokens" in line
    assert "burstgpt: Timestamp, Request tokens, Response tokens" in line
    assert line.endswith(
        "or name this trace's with --columns timestamp=TIME,input_tokens=PROMPT_TOKENS,output_tokens=OUTPUT_TOKENS"
    )


def test_a_length_that_is_not_a_number_is_a_bad_line_naming_line_and_column(tmp_path):
    good = "2023-11-16 18:17:03.9799600,4808,10"
    log = write(tmp_path / "azure.csv", AZURE_HEADER, good, "2023-11-16 18:17:04.0319600,many,8")
    data, _ = profile_json(str(log))
    assert data["num_requests"] == 1 and data["bad_lines"] == ["line 3: ContextTokens: must be a number (got 'many')"]
    log = write(tmp_path / "azure.csv", AZURE_HEADER, "2023-11-16 18:17:04.0319600,many,8")
    assert one_error_line(str(log)) == f"error: {log}: line 2: ContextTokens: must be a number (got 'many')"
    log = write(tmp_path / "burst.csv", BURSTGPT_HEADER, "5,ChatGPT,472,-3,469,API log")
    assert one_error_line(str(log)) == f"error: {log}: line 2: Response tokens: must be >= 0 (got -3)"


def test_a_bad_timestamp_is_a_bad_line_naming_line_and_column(tmp_path):
    good = "2023-11-16 18:17:03.9799600,4808,10"
    log = write(tmp_path / "azure.csv", AZURE_HEADER, good, "2023-13-45 18:17:04,3180,8")
    data, _ = profile_json(str(log))
    assert data["bad_lines"] == ["line 3: TIMESTAMP: is not a number or an ISO 8601 time (got '2023-13-45 18:17:04')"]
    log = write(tmp_path / "azure.csv", AZURE_HEADER, "yesterday,3180,8")
    message = f"error: {log}: line 2: TIMESTAMP: is not a number or an ISO 8601 time (got 'yesterday')"
    assert one_error_line(str(log)) == message
    log = write(tmp_path / "mapped.csv", "t,i,o", ",1,1")
    args = (str(log), "--columns", "timestamp=t,input_tokens=i,output_tokens=o")
    assert one_error_line(*args) == f"error: {log}: line 2: t: empty"


def test_a_trace_of_failed_requests_only_is_one_line(tmp_path):
    log = write(tmp_path / "burst.csv", BURSTGPT_HEADER, "5,ChatGPT,472,0,472,API log", "9,GPT-4,10,0,10,API log")
    message = f"error: {log}: line 2: Response tokens: 0 (a failed request); all 2 rows are failed requests"
    assert one_error_line(str(log)) == message


def test_a_row_of_another_width_a_missing_mapped_column_and_bad_options_are_one_line(tmp_path):
    log = write(tmp_path / "azure.csv", AZURE_HEADER, "2023-11-16 18:17:03.9799600,4808,10,extra", "x,1,2")
    assert one_error_line(str(log)) == f"error: {log}: line 2: csv: 4 fields where the header has 3"
    mapped = ("--columns", "timestamp=TIMESTAMP,input_tokens=Prompt,output_tokens=GeneratedTokens")
    line = one_error_line(str(log), *mapped)
    assert line == (
        f"error: {log}: line 1: header: has no column 'Prompt', which --columns maps input_tokens to"
        " (its columns: TIMESTAMP, ContextTokens, GeneratedTokens)"
    )
    line = one_error_line(str(log), "--format", "burstgpt")
    assert line.startswith(f"error: {log}: line 1: header: has no column 'Timestamp', which burstgpt traces have")
    assert one_error_line(str(log), "--columns", "when=TIMESTAMP").startswith("error: --columns: unknown field 'when'")
    assert one_error_line(str(log), "--columns", "timestamp=TIMESTAMP") == (
        "error: --columns: missing input_tokens, output_tokens; give e.g. --columns"
        " timestamp=TIME,input_tokens=PROMPT_TOKENS,output_tokens=OUTPUT_TOKENS"
    )
    assert one_error_line(str(log), "--time-unit", "ms").startswith("error: --time-unit: is the unit of the times")
    assert one_error_line(str(log), *mapped, "--time-unit", "h").startswith("error: --time-unit: must be one of s,")
    assert one_error_line(str(log), "--format", "mapped").startswith("error: --format: mapped reads the columns")
    assert one_error_line(str(log), "--format", "csv").startswith(
        "error: --format: must be one of auto, openai, mooncake, kvplan, azure, burstgpt, mapped"
    )
