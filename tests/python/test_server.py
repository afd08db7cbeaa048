"""A real ``agentry serve`` process driven by the unmodified SDK client.

The server binary is ``$AGENTRY_BIN`` (``cargo xtask test`` builds it). It runs with a
configuration file that keeps the embedded demo agents and adds two API keys (subjects
``alice`` and ``bob``), on a fresh SQLite file, on a free loopback port. Every test talks
to it over HTTP: the SDK's ``AgentSessionClient`` for the harness API, ``httpx`` for bad
input, the event feeds and AG-UI (parsed with ``ag-ui-protocol``).
"""

import base64
import concurrent.futures
import contextlib
import json
import os
import pty
import select
import shutil
import time
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import unittest
import uuid

import httpx
from ag_ui.core import Event as AgUiEvent
import pydantic
from truefoundry_gateway_sdk.agents import AgentSessionClient
from truefoundry_gateway_sdk.core.api_error import ApiError
from truefoundry_gateway_sdk.errors import (
    BadRequestError,
    NotFoundError,
    PreconditionFailedError,
    UnauthorizedError,
)
from truefoundry_gateway_sdk.types import (
    ApprovalAllow,
    ApprovalDeny,
    ModelMessageDeltaEvent,
    ModelMessageEvent,
    ThreadCreatedEvent,
    ThreadDoneEvent,
    ToolApprovalRequiredEvent,
    ToolResponseEvent,
    ToolResponseRequiredEvent,
    TurnCreatedEvent,
    TurnDoneEvent,
    UserMessage,
    UserToolApprovalEvent,
    UserToolResponseEvent,
)

ALICE = "alice-test-key-0123456789"
BOB = "bob-test-key-9876543210"
BODY_LIMIT = 256 * 1024

SERVER = {}


def setUpModule():
    binary = os.environ.get("AGENTRY_BIN")
    if not binary:
        raise RuntimeError("AGENTRY_BIN is not set: run the tests through `cargo xtask test`")
    workdir, config = write_config(
        "server",
        f"""
[limits]
body_bytes = {BODY_LIMIT}
heartbeat_secs = 1

[[keys]]
key_env = "AGENTRY_TEST_KEY_ALICE"
subject = "alice"

[[keys]]
key_env = "AGENTRY_TEST_KEY_BOB"
subject = "bob"
""",
    )
    SERVER["process"], SERVER["url"], SERVER["log"] = start_server(workdir, config)
    SERVER["workdir"] = workdir


# Every server's directory lives under this one, which ``tearDownModule`` removes.
WORKDIRS = tempfile.mkdtemp(prefix="agentry-python-tests-")


def write_config(name, sections, durability="batched", listen="127.0.0.1:0"):
    """A fresh directory with an ``agentry.toml``: ``listen`` (a free loopback port by
    default), a SQLite file in the directory, then ``sections``. Returns (directory,
    config path)."""
    workdir = tempfile.mkdtemp(prefix=f"{name}-", dir=WORKDIRS)
    config = os.path.join(workdir, "agentry.toml")
    with open(config, "w") as f:
        f.write(f'listen = "{listen}"\n[storage]\npath = "{workdir}/agentry.db"\ndurability = "{durability}"\n')
        f.write(sections)
    return workdir, config


def start_server(workdir, config):
    """Starts ``agentry serve --config config``; returns (process, base URL, log file)."""
    env = dict(os.environ, AGENTRY_TEST_KEY_ALICE=ALICE, AGENTRY_TEST_KEY_BOB=BOB, RUST_LOG="warn")
    log = open(os.path.join(workdir, "server.log"), "a")
    process = subprocess.Popen(
        [os.environ["AGENTRY_BIN"], "serve", "--config", config],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
    )
    line = process.stdout.readline()
    if not line.startswith("agentry listening on "):
        process.kill()
        process.wait()
        log.close()
        with open(os.path.join(workdir, "server.log")) as f:
            raise RuntimeError(f"the server did not start: {line!r}; its log:\n{f.read()}")
    return process, line.strip().rsplit(" ", 1)[1], log


def tearDownModule():
    try:
        for http_client in OPENED:
            http_client.close()
        stop_shared_server()
    finally:
        # AGENTRY_KEEP_TEST_DIRS keeps the servers' stores and logs for a look afterwards.
        if os.environ.get("AGENTRY_KEEP_TEST_DIRS"):
            print(f"test servers' directories kept in {WORKDIRS}")
        else:
            shutil.rmtree(WORKDIRS, ignore_errors=True)


def stop_shared_server():
    process = SERVER.get("process")
    if process is None:
        return
    # Graceful shutdown: SIGTERM stops it cleanly (exit code 0) even with open streams.
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=30)
    process.stdout.close()
    SERVER["log"].close()
    if code != 0:
        with open(os.path.join(SERVER["workdir"], "server.log")) as f:
            raise AssertionError(f"the server exited with {code} after SIGTERM; its log:\n{f.read()}")


# Every HTTP client the tests open, closed by ``tearDownModule`` (left to the garbage
# collector, each open connection would be reported as a ResourceWarning).
OPENED = []


def opened(http_client):
    OPENED.append(http_client)
    return http_client


def sdk(url, key):
    """The SDK's client on a connection pool of our own, so that it can be closed."""
    pool = opened(httpx.Client(timeout=60, follow_redirects=True))
    return AgentSessionClient(base_url=url, api_key=key, timeout=60, httpx_client=pool)


def client(key=ALICE):
    return sdk(SERVER["url"], key)


def http(key=ALICE):
    return opened(httpx.Client(base_url=SERVER["url"], headers={"Authorization": f"Bearer {key}"}, timeout=60))


def message(text):
    return [UserMessage(content=text)]


def replay_ids(h, subscribe):
    """The SSE ids of a turn's whole stream, in order."""
    with h.stream("POST", subscribe, json={}) as replay:
        return [line[3:].strip() for line in replay.iter_lines() if line.startswith("id:")]


def run(session, input):
    """Streams a turn; returns (events, sequence numbers). Checks that subscribing to the
    finished turn from the start replays exactly the same events."""
    prepared = session.prepare_turn(input=input)
    items = list(prepared.execute())
    replay = list(prepared.stream(after_sequence_number=0))
    assert [i.sequence_number for i in replay] == [i.sequence_number for i in items], "replay differs"
    assert [i.event.type for i in replay] == [i.event.type for i in items], "replay differs"
    return [item.event for item in items], [item.sequence_number for item in items]


def wait_until_idle(h, turns):
    """Waits for the session's latest turn to end, by following its stream to the end."""
    latest = h.get(turns, params={"limit": 1}).json()["data"][0]["id"]
    with h.stream("POST", f"{turns}/{latest}/subscribe", json={}) as stream:
        for _ in stream.iter_lines():
            pass


def merged_text(events, thread="main"):
    final = [e for e in events if isinstance(e, ModelMessageEvent) and e.thread_id == thread]
    return final[-1].content if final else None


class Lifecycle(unittest.TestCase):
    def check_stream(self, events, seqs):
        self.assertIsInstance(events[0], TurnCreatedEvent)
        self.assertIsInstance(events[-1], TurnDoneEvent)
        self.assertEqual(seqs, sorted(set(seqs)), "seq increases")
        self.assertEqual(sum(isinstance(e, TurnCreatedEvent) for e in events), 1)

    def test_echo_streams_deltas_then_the_message(self):
        session = client().create_session(agent_name="demo")
        events, seqs = run(session, message("hello there"))
        self.check_stream(events, seqs)
        deltas = [e for e in events if isinstance(e, ModelMessageDeltaEvent)]
        self.assertGreater(len(deltas), 2, "echo streams several deltas")
        self.assertEqual("".join(d.content or "" for d in deltas), "Echo: hello there")
        self.assertEqual(merged_text(events), "Echo: hello there")
        self.assertEqual(events[-1].state.status, "done")

    def test_calculate_runs_the_calculator(self):
        session = client().create_session(agent_name="demo")
        events, seqs = run(session, message("please calculate (2 + 3) * 4"))
        self.check_stream(events, seqs)
        results = [e for e in events if isinstance(e, ToolResponseEvent)]
        self.assertEqual([r.content for r in results], ["20"])
        self.assertEqual(merged_text(events), "The result is 20.")

    def approval(self, session):
        events, seqs = run(session, message("send an email to the team"))
        self.check_stream(events, seqs)
        required = [e for e in events if isinstance(e, ToolApprovalRequiredEvent)]
        self.assertEqual(len(required), 1)
        self.assertEqual(events[-1].state.status, "done")
        return required[0]

    def test_email_approved_is_sent(self):
        session = client().create_session(agent_name="demo")
        required = self.approval(session)
        call = required.tool_calls[0]
        answer = UserToolApprovalEvent(thread_id=required.thread_id, tool_call_id=call.id, approval=ApprovalAllow())
        events, seqs = run(session, [answer])
        self.check_stream(events, seqs)
        self.assertTrue(any(isinstance(e, ToolResponseEvent) and e.tool_call_id == call.id for e in events))
        self.assertEqual(merged_text(events), "Email sent.")

    def test_email_denied_is_not_sent_and_the_reason_reaches_the_model(self):
        session = client().create_session(agent_name="demo")
        required = self.approval(session)
        call = required.tool_calls[0]
        deny = ApprovalDeny(reason="not today")
        answer = UserToolApprovalEvent(thread_id=required.thread_id, tool_call_id=call.id, approval=deny)
        events, _ = run(session, [answer])
        self.assertEqual(merged_text(events), "Email not sent: not today.")

    def test_ask_me_waits_for_the_answer(self):
        session = client().create_session(agent_name="demo")
        events, _ = run(session, message("ask me something"))
        required = [e for e in events if isinstance(e, ToolResponseRequiredEvent)]
        self.assertEqual(len(required), 1)
        call = required[0].tool_calls[0]
        asked = [e for e in events if isinstance(e, ModelMessageEvent) and e.tool_calls]
        arguments = json.loads(asked[-1].tool_calls[0].function.arguments)
        self.assertIn("green", arguments["options"])
        answer = UserToolResponseEvent(thread_id=required[0].thread_id, tool_call_id=call.id, content="green")
        events, _ = run(session, [answer])
        self.assertEqual(merged_text(events), "You chose green.")

    def test_invalid_answers_are_refused_and_change_nothing(self):
        session = client().create_session(agent_name="demo")
        required = self.approval(session)
        call = required.tool_calls[0]
        allow = UserToolApprovalEvent(thread_id=required.thread_id, tool_call_id=call.id, approval=ApprovalAllow())
        wrong_call = UserToolApprovalEvent(thread_id=required.thread_id, tool_call_id="nope", approval=ApprovalAllow())
        before = [t.id for t in session.list_turns()]
        for bad in ([UserMessage(content="hi"), allow], [wrong_call], [allow, allow], message("new topic")):
            with self.assertRaises(BadRequestError) as caught:
                list(session.prepare_turn(input=bad).execute())
            self.assertTrue(caught.exception.body.error.message)
        self.assertEqual([t.id for t in session.list_turns()], before, "nothing was stored")
        events, _ = run(session, [allow])
        self.assertEqual(merged_text(events), "Email sent.")

    def test_listing_sessions_turns_and_events(self):
        alice = client()
        session = alice.create_session(agent_name="demo")
        run(session, message("first"))
        run(session, message("calculate 6 * 7"))
        listed = [s.id for s in alice.list_sessions(agent_name="demo", limit=100)]
        self.assertIn(session.id, listed)
        newest_first = [s.id for s in alice.list_sessions(agent_name="demo", limit=3)]
        oldest_first = [s.id for s in alice.list_sessions(agent_name="demo", limit=3, order="asc")]
        self.assertEqual(newest_first, list(reversed(oldest_first)), "the pager walks every page either way")
        self.assertEqual(newest_first[0], session.id)
        turns = list(session.list_turns(limit=1))
        self.assertEqual(len(turns), 2, "the pager walks every page")
        self.assertEqual(turns[0].previous_turn_id, turns[1].id, "newest first, chained")
        latest = session.get_turn(turns[0].id)
        self.assertEqual(latest.state.status, "done")
        asc = list(latest.list_events(order="asc", limit=2))
        desc = list(latest.list_events(order="desc", limit=3))
        self.assertEqual([e.id for e in asc], [e.id for e in reversed(desc)])
        kinds = [e.type for e in asc]
        self.assertNotIn("turn.created", kinds)
        self.assertNotIn("turn.done", kinds)
        self.assertEqual(kinds, ["model.message", "tool.response", "model.message"])
        history = list(session.list_events(limit=4))
        self.assertEqual(history[0].event.type, "turn.done")
        self.assertEqual(history[0].turn_id, turns[0].id)
        self.assertEqual(history[-1].event.type, "turn.created")
        self.assertEqual(history[-1].turn_id, turns[1].id)

    def test_a_dropped_slow_stream_resumes_where_it_stopped(self):
        session = client().create_session(agent_name="demo")
        prepared = session.prepare_turn(input=message("go slow please"))
        stream = prepared.execute()
        first = [next(stream) for _ in range(20)]
        stream.close()  # drops the connection
        last = first[-1].sequence_number
        self.assertEqual(prepared.state.status, "running")
        # The header wins over the body's cursor.
        header = {"additional_headers": {"Last-Event-ID": str(last - 5)}}
        replay = prepared.stream(after_sequence_number=1, request_options=header)
        self.assertEqual(next(replay).sequence_number, last - 4)
        replay.close()
        rest = list(prepared.stream(after_sequence_number=last))
        seqs = [item.sequence_number for item in first + rest]
        # The turn's live log is kept after it ends: a full replay is the reference.
        full = [item.sequence_number for item in prepared.stream(after_sequence_number=0)]
        self.assertEqual(seqs, full, "every event once, in order, across the reconnect")
        events = [item.event for item in first + rest]
        text = "".join(e.content or "" for e in events if isinstance(e, ModelMessageDeltaEvent))
        self.assertEqual(len(text), 200)
        self.assertEqual(merged_text(events), text)
        self.assertIsInstance(events[-1], TurnDoneEvent)

    def test_cancel_a_running_turn_then_continue(self):
        alice = client()
        session = alice.create_session(agent_name="demo")
        raw = alice._client.agents.sessions
        running = raw.create_turn(session.id, input=message("slow")).data
        self.assertEqual(running.state.status, "running")
        # A second turn while one runs is refused.
        with self.assertRaises(PreconditionFailedError):
            raw.create_turn(session.id, input=message("me too"))
        # A running turn has no stored event list yet.
        with self.assertRaises(PreconditionFailedError):
            list(session.get_turn(running.id).list_events())
        # A cursor past every number the running turn has given out is not one of its own:
        # refused, rather than answered with a stream that waits for nothing and ends empty.
        with http() as h:
            subscribe = f"/v1/agents/sessions/{session.id}/turns/{running.id}/subscribe"
            past = h.post(subscribe, json={}, headers={"Last-Event-ID": "99999"})
            self.assertEqual(past.status_code, 400, past.text)
            self.assertEqual(past.json()["error"]["param"], "Last-Event-ID", past.text)
            self.assertIn("given out", past.json()["error"]["message"])
            with h.stream("POST", subscribe, json={"after_sequence_number": 1}) as live:
                self.assertEqual(live.status_code, 200)
        session.cancel()
        cancelled = session.get_turn(running.id)
        self.assertEqual(cancelled.state.status, "cancelled")
        self.assertEqual(cancelled.state.reason, "client-cancelled")
        session.cancel()  # idempotent
        events, _ = run(session, message("are you there"))
        self.assertEqual(merged_text(events), "Echo: are you there")
        self.assertEqual(events[0].previous_turn_id, running.id, "the next turn chains on the cancelled one")

    def test_fifty_concurrent_turns_one_runs(self):
        session = client().create_session(agent_name="demo")
        outcomes = []

        def attempt():
            try:
                client()._client.agents.sessions.create_turn(session.id, input=message("slow"))
                outcomes.append("ran")
            except PreconditionFailedError:
                outcomes.append("refused")

        threads = [threading.Thread(target=attempt) for _ in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(sorted(outcomes), ["ran"] + ["refused"] * 49)
        self.assertEqual(len(list(session.list_turns())), 1, "nothing else was stored")
        session.cancel()

    def test_a_turn_request_sent_again_under_its_idempotency_key_runs_once(self):
        with http() as h:
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            turns = f"/v1/agents/sessions/{sid}/turns"
            body = {"input": [{"type": "user.message", "content": "calculate 6 * 7"}]}

            def send_copy(_):
                with http() as other:
                    response = other.post(turns, json=body, headers={"Idempotency-Key": "order-1"})
                    return response.status_code, response.json()["data"]["id"], response.headers.get("idempotent-replayed")

            # Copies sent at once (a client retrying on other connections) are one turn.
            with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
                copies = list(pool.map(send_copy, range(6)))
            self.assertEqual({status for status, _, _ in copies}, {200}, copies)
            self.assertEqual(len({turn for _, turn, _ in copies}), 1, copies)
            self.assertEqual(sorted(str(replayed) for _, _, replayed in copies), ["None"] + ["true"] * 5, copies)
            turn = copies[0][1]
            wait_until_idle(h, turns)
            # Sent again after its end, streamed: the same turn's events, from its start.
            with h.stream("POST", turns, json={**body, "stream": True}, headers={"Idempotency-Key": "order-1"}) as again:
                self.assertEqual(again.headers.get("idempotent-replayed"), "true")
                ids = [line[3:].strip() for line in again.iter_lines() if line.startswith("id:")]
            self.assertEqual(ids, replay_ids(h, f"{turns}/{turn}/subscribe"))
            listed = h.get(turns).json()["data"]
            self.assertEqual([t["id"] for t in listed], [turn], "one turn ran")
            # The key names one request: other input under it is refused, and runs nothing.
            other = h.post(turns, json={"input": [{"type": "user.message", "content": "something else"}]},
                           headers={"Idempotency-Key": "order-1"})
            self.assertEqual(other.status_code, 400, other.text)
            self.assertEqual(other.json()["error"]["param"], "Idempotency-Key", other.text)
            self.assertEqual(other.json()["error"]["code"], "idempotency_key_reused")
            self.assertIn(turn, other.json()["error"]["message"])
            for key in ("", "k" * 2000):
                bad = h.post(turns, json=body, headers={"Idempotency-Key": key})
                self.assertEqual(bad.status_code, 400, bad.text)
                self.assertEqual(bad.json()["error"]["param"], "Idempotency-Key", bad.text)
            self.assertEqual(len(h.get(turns).json()["data"]), 1, "nothing else was stored")
            # A new key is a new request; sent again, it is that request, however it named
            # the turn it follows (`none` no longer fits once it ran; an id in capitals).
            fresh = h.post(turns, json={**body, "previous_turn_id": turn.upper()}, headers={"Idempotency-Key": "order-2"})
            self.assertEqual(fresh.status_code, 200, fresh.text)
            self.assertNotIn("idempotent-replayed", fresh.headers)
            wait_until_idle(h, turns)
            again = h.post(turns, json={**body, "previous_turn_id": turn.upper()}, headers={"Idempotency-Key": "order-2"})
            self.assertEqual((again.status_code, again.json()["data"]["id"]), (200, fresh.json()["data"]["id"]), again.text)
            self.assertEqual(len(h.get(turns).json()["data"]), 2)
            # A session's first turn, sent with `none`, and sent again once it has run.
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            first = {**body, "previous_turn_id": "none"}
            sent = [h.post(f"/v1/agents/sessions/{sid}/turns", json=first, headers={"Idempotency-Key": "first"}) for _ in range(2)]
            self.assertEqual([r.status_code for r in sent], [200, 200], [r.text for r in sent])
            self.assertEqual(sent[0].json()["data"]["id"], sent[1].json()["data"]["id"])
            # A previous turn id that is none is not found, as it is for a first request.
            garbage = h.post(f"/v1/agents/sessions/{sid}/turns", json={**body, "previous_turn_id": "garbage"},
                             headers={"Idempotency-Key": "first"})
            self.assertEqual(garbage.status_code, 404, garbage.text)
            # An unknown session is not found, whatever the key.
            unknown = h.post("/v1/agents/sessions/00000000-0000-0000-0000-000000000000/turns", json=body,
                             headers={"Idempotency-Key": ""})
            self.assertEqual(unknown.status_code, 404, unknown.text)

    def test_a_turn_refused_while_another_runs_is_told_which(self):
        with http() as h:
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            turns = f"/v1/agents/sessions/{sid}/turns"
            running = h.post(turns, json={"input": [{"type": "user.message", "content": "slow"}]}).json()["data"]["id"]
            refused = h.post(turns, json={"input": [{"type": "user.message", "content": "hi"}]})
            self.assertEqual(refused.status_code, 412, refused.text)
            self.assertTrue(refused.json()["error"]["message"].endswith(running), refused.text)
            h.post(f"/v1/agents/sessions/{sid}/cancel", json={})

    def test_a_session_is_deleted_with_its_turns_only_while_none_runs(self):
        with http() as h:
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            path = f"/v1/agents/sessions/{sid}"
            running = h.post(f"{path}/turns", json={"input": [{"type": "user.message", "content": "slow"}]}).json()["data"]["id"]
            refused = h.delete(path)
            self.assertEqual(refused.status_code, 412, refused.text)
            self.assertEqual(refused.json()["error"]["code"], "turn_running")
            self.assertIn(running, refused.json()["error"]["message"])
            self.assertEqual(h.get(f"/v1/agents/turns/{running}").status_code, 200, "nothing was deleted")
            self.assertEqual(h.post(f"{path}/cancel", json={}).status_code, 200)
            # A feed of the session, open while it is deleted, ends saying so.
            connected, feed = threading.Event(), []
            follower = threading.Thread(
                target=lambda: feed.extend(feed_frames(http(), f"/event?session_id={sid}", connected=connected)),
                daemon=True,
            )
            follower.start()
            self.assertTrue(connected.wait(30))
            deleted = h.delete(path)
            self.assertEqual(deleted.status_code, 200, deleted.text)
            self.assertEqual(deleted.json()["data"], {"type": "session", "id": sid, "deleted": True})
            for gone in (path, f"{path}/turns", f"/v1/agents/turns/{running}", f"{path}/turns/{running}/events"):
                self.assertEqual(h.get(gone).status_code, 404, gone)
            self.assertEqual(h.delete(path).status_code, 404)
            follower.join(30)
            self.assertFalse(follower.is_alive(), "the feed of the deleted session ended")
            self.assertTrue(feed, "the feed sent nothing")
            self.assertEqual(feed[-1][1], {"type": "session.deleted", "properties": {"sessionID": sid}})
            self.assertEqual(h.get("/event", params={"session_id": sid}).status_code, 404)
            # Another subject's session is not found, and stays.
            with http(BOB) as bob:
                theirs = bob.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
                self.assertEqual(h.delete(f"/v1/agents/sessions/{theirs}").status_code, 404)
                self.assertEqual(bob.get(f"/v1/agents/sessions/{theirs}").status_code, 200)

    def test_another_subject_sees_nothing(self):
        alice, bob = client(ALICE), client(BOB)
        session = alice.create_session(agent_name="demo")
        run(session, message("secret"))
        turn = list(session.list_turns())[0]
        with self.assertRaises(NotFoundError):
            bob.get_session(session.id)
        self.assertNotIn(session.id, [s.id for s in bob.list_sessions(agent_name="demo", limit=100)])
        raw = bob._client.agents.sessions
        with self.assertRaises(NotFoundError):
            raw.create_turn(session.id, input=message("hijack"))
        with self.assertRaises(NotFoundError):
            raw.get_turn(session.id, turn.id)
        with self.assertRaises(NotFoundError):
            list(raw.list_turn_events(session.id, turn.id))
        # The SDK documents no 404 for cancel: it raises its generic ApiError with the status.
        with self.assertRaises(ApiError) as caught:
            raw.cancel(session.id)
        self.assertEqual(caught.exception.status_code, 404)
        with self.assertRaises(UnauthorizedError):
            client("wrong-key").create_session(agent_name="demo")

    def test_demo_team_runs_members_on_concurrent_threads(self):
        session = client().create_session(agent_name="demo-team")
        events, seqs = run(session, message("otters"))
        self.check_stream(events, seqs)
        created = [e for e in events if isinstance(e, ThreadCreatedEvent)]
        done = [e for e in events if isinstance(e, ThreadDoneEvent)]
        self.assertEqual(sorted(e.agent_info.name for e in created), ["researcher", "writer"])
        self.assertEqual({e.thread_id for e in created}, {e.thread_id for e in done})
        self.assertEqual(len({e.thread_id for e in created}), 2)
        self.assertTrue(all(e.state.status == "done" for e in done))
        first_done = events.index(done[0])
        self.assertTrue(all(events.index(e) < first_done for e in created), "both threads ran at once")
        answer = merged_text(events)
        self.assertIn("Research notes on: otters", answer)
        self.assertIn("Draft about: otters", answer)


def stream_a_turn(url, text, count):
    """Starts a turn of ``text`` on a new demo session and reads its first ``count``
    events; returns (session, turn id, the events, the open stream)."""
    alice = sdk(url, "unused")
    session = alice.create_session(agent_name="demo")
    prepared = session.prepare_turn(input=message(text))
    stream = prepared.execute()
    seen = [next(stream) for _ in range(count)]
    # The turn's id is known once its stream has started.
    return session, prepared.id, seen, stream


def closed(process, log):
    """Waits for a stopping server and closes its pipes."""
    process.wait()
    process.stdout.close()
    log.close()


class Durable(unittest.TestCase):
    def test_a_stream_cut_by_shutdown_raises_in_the_client_instead_of_ending_as_if_finished(self):
        sections = "[limits]\nshutdown_grace_secs = 1\n[runtime]\nlease_ttl_secs = 300\n"
        workdir, config = write_config("cut-stream", sections)
        first, url, log = start_server(workdir, config)
        try:
            _, _, seen, stream = stream_a_turn(url, "slow please", 5)
            first.send_signal(signal.SIGTERM)
            rest = []
            with self.assertRaises(httpx.RemoteProtocolError):
                for item in stream:
                    rest.append(item)
            self.assertFalse(any(isinstance(item.event, TurnDoneEvent) for item in seen + rest))
            self.assertEqual(first.wait(timeout=30), 0)
        finally:
            if first.poll() is None:
                first.kill()
            closed(first, log)

    def test_a_stopped_server_leaves_its_whole_store_in_the_database_file(self):
        # An operator who stops the server and copies the database file gets every write:
        # nothing is left only in SQLite's log beside it.
        for attempt in range(3):
            workdir, config = write_config(f"stopped-{attempt}", "")
            server, url, log = start_server(workdir, config)
            try:
                with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {ALICE}"}) as h:
                    for _ in range(40):
                        created = h.post("/v1/agents/sessions", json={"agent_name": "demo"})
                        self.assertEqual(created.status_code, 200, created.text)
                server.send_signal(signal.SIGTERM)
                self.assertEqual(server.wait(timeout=30), 0)
            finally:
                if server.poll() is None:
                    server.kill()
                closed(server, log)
            copy = os.path.join(workdir, "copy.db")
            shutil.copyfile(os.path.join(workdir, "agentry.db"), copy)
            with contextlib.closing(sqlite3.connect(copy)) as database:
                (count,) = database.execute("SELECT count(*) FROM sessions").fetchone()
            self.assertEqual(count, 40, f"attempt {attempt}: the file alone holds {count} of 40 sessions")

    def test_a_killed_server_finishes_the_turn_after_restart(self):
        workdir, config = write_config("durable", "[runtime]\nlease_ttl_secs = 2\n", durability="strict")
        first, url, log = start_server(workdir, config)
        try:
            with httpx.Client(base_url=url, timeout=60) as h:
                asked = agui_run(h, {"threadId": "restart-thread", "runId": "r1", "messages": [
                    {"id": "m1", "role": "user", "content": "ask me"}]})
            interrupt = asked[-1].outcome.interrupts[0]
            session, turn_id, seen, stream = stream_a_turn(url, "slow, then crash", 30)
        finally:
            first.kill()  # SIGKILL: no shutdown, the turn is left running
            closed(first, log)
        stream.close()
        second, url, log = start_server(workdir, config)
        try:
            alice = sdk(url, "unused")
            session = alice.get_session(session.id)
            turn = session.get_turn(turn_id)
            self.assertEqual(turn.state.status, "running")
            last = seen[-1].sequence_number
            rest = list(turn.stream(after_sequence_number=last))
            seqs = [item.sequence_number for item in seen + rest]
            self.assertEqual(seqs, sorted(set(seqs)), "no event twice across the crash")
            self.assertIsInstance(rest[-1].event, TurnDoneEvent)
            self.assertEqual(rest[-1].event.state.status, "done")
            final = [i.event for i in rest if isinstance(i.event, ModelMessageEvent)]
            self.assertEqual(len(final[-1].content), 200)
            self.assertEqual(session.get_turn(turn_id).state.status, "done")
            # The recovered turn counts in the new server's metrics like a turn it started
            # (counted just after the turn ends, so the count is awaited, with a deadline).
            deadline = time.monotonic() + 10
            counted = 'agentry_turns_finished_total{status="done"} 1'
            while counted not in httpx.get(f"{url}/metrics").text.splitlines():
                self.assertLess(time.monotonic(), deadline, "the recovered turn never counted as finished")
                time.sleep(0.01)
            # The session takes new turns again.
            events, _ = run(session, message("back"))
            self.assertEqual(merged_text(events), "Echo: back")
            # An AG-UI thread continues after the restart: its interrupt is answered.
            with httpx.Client(base_url=url, timeout=60) as h:
                resumed = agui_run(h, {"threadId": "restart-thread", "runId": "r2", "messages": [], "resume": [
                    {"interruptId": interrupt.id, "status": "resolved", "payload": "blue"}]})
            text = "".join(e.delta for e in resumed if kind(e) == "TEXT_MESSAGE_CONTENT")
            self.assertEqual(text, "You chose blue.")
        finally:
            second.send_signal(signal.SIGTERM)
            self.assertEqual(second.wait(timeout=30), 0)
            second.stdout.close()
            log.close()


    def test_a_turn_left_for_an_agent_the_server_no_longer_has_is_reported_and_ends_when_cancelled(self):
        workdir, config = write_config("agent-gone", "[runtime]\nlease_ttl_secs = 2\n")
        first, url, log = start_server(workdir, config)
        try:
            session, turn_id, _, stream = stream_a_turn(url, "slow", 5)
        finally:
            first.kill()  # SIGKILL: the turn is left running
            closed(first, log)
        stream.close()
        # The same store, served without the demo agents.
        without = os.path.join(workdir, "without-demo.toml")
        with open(config) as f:
            text = f.read()
        with open(without, "w") as f:
            f.write("demo_agents = false\n" + text)
        second, url, log = start_server(workdir, without)
        try:
            # Once the dead server's lease has lapsed, a recovery pass tells the operator.
            deadline = time.monotonic() + 30
            while True:
                with open(os.path.join(workdir, "server.log")) as f:
                    warned = [line for line in f if "waits for a process that has its agent" in line]
                if warned:
                    break
                self.assertLess(time.monotonic(), deadline, "no warning of the left turn")
                time.sleep(0.05)
            self.assertIn(turn_id, warned[0])
            self.assertIn("agent=demo", warned[0])
            with httpx.Client(base_url=url, timeout=60) as h:
                turn = f"/v1/agents/turns/{turn_id}"
                self.assertEqual(h.get(turn).json()["data"]["state"]["status"], "running")
                # Cancelling its session ends it here, which needs no agent.
                self.assertEqual(h.post(f"/v1/agents/sessions/{session.id}/cancel", json={}).status_code, 200)
                while h.get(turn).json()["data"]["state"]["status"] == "running":
                    self.assertLess(time.monotonic(), deadline + 30, "the cancelled turn never ended")
                    time.sleep(0.05)
                self.assertEqual(h.get(turn).json()["data"]["state"]["status"], "cancelled")
        finally:
            second.send_signal(signal.SIGTERM)
            self.assertEqual(second.wait(timeout=30), 0)
            closed(second, log)

    def test_an_instance_whose_process_died_is_cancelled_through_its_mission(self):
        # A lease far longer than the test: the restarted server leaves the dead turn alone.
        workdir, config = write_config("dead-instance", "[runtime]\nlease_ttl_secs = 300\n")
        first, url, log = start_server(workdir, config)
        try:
            with httpx.Client(base_url=url, timeout=60) as h:
                session = h.post("/v1/agents/sessions", json={"agent_name": "demo-team"}).json()["data"]["id"]
                body = {"session_id": session, "role": "analyst", "task": "slow work", "justification": "ops"}
                spawned = h.post("/v1/agent-team/spawn", json=body).json()
                # From the session's first event: the instance may start before a feed at
                # the live edge is connected.
                started = lambda f: f["type"] == "agent_team.instance.started"
                feed_frames(h, f"/event?session_id={session}&after=0", until=started)
        finally:
            first.kill()
            closed(first, log)
        second, url, log = start_server(workdir, config)
        try:
            with httpx.Client(base_url=url, timeout=60) as h:
                running = h.get("/v1/agent-team/instances", params={"status": "running"}).json()["data"]
                ours = [i["instanceID"] for i in running if i["missionID"] == spawned["missionID"]]
                self.assertEqual(len(ours), 1, running)
                refused = h.post(f"/v1/agent-team/instances/{ours[0]}/cancel")
                self.assertEqual(refused.status_code, 409, refused.text)
                self.assertEqual(refused.json()["error"]["code"], "instance_elsewhere")
                self.assertIn(spawned["missionID"], refused.json()["error"]["message"])
                self.assertEqual(h.post(f"/v1/agent-team/missions/{spawned['missionID']}/cancel").status_code, 200)
        finally:
            second.send_signal(signal.SIGTERM)
            self.assertEqual(second.wait(timeout=30), 0)
            second.stdout.close()
            log.close()

    def test_a_turn_still_running_after_the_shutdown_grace_is_recovered_at_once(self):
        # A lease time far longer than the test may take: only a handed-over lease lets
        # the restarted server take the turn at once.
        sections = "[limits]\nshutdown_grace_secs = 1\n[runtime]\nlease_ttl_secs = 300\n"
        workdir, config = write_config("handover", sections)
        first, url, log = start_server(workdir, config)
        try:
            session, turn_id, seen, stream = stream_a_turn(url, "slow, then stop", 10)
            # An AG-UI run cut by the same shutdown ends with RUN_ERROR, not mid-message.
            agui = []
            body = {"threadId": "handover-thread", "runId": "r1", "messages": [{"id": "m", "role": "user", "content": "slow"}]}

            def follow():
                adapter = pydantic.TypeAdapter(AgUiEvent)
                with httpx.Client(base_url=url, timeout=60) as h, h.stream("POST", "/agui/demo", json=body) as response:
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            agui.append(adapter.validate_json(line[5:].strip()))

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            deadline = time.monotonic() + 30
            while not any(kind(e) == "TEXT_MESSAGE_CONTENT" for e in list(agui)):
                self.assertLess(time.monotonic(), deadline, "the AG-UI run never streamed")
                time.sleep(0.01)
            first.send_signal(signal.SIGTERM)  # the turn needs ~10 s, the grace is 1 s
            self.assertEqual(first.wait(timeout=30), 0)
            follower.join(timeout=30)
            self.assertEqual(kind(agui[-1]), "RUN_ERROR", [kind(e) for e in agui])
            self.assertEqual(agui[-1].code, "run_interrupted")
        finally:
            if first.poll() is None:
                first.kill()
            closed(first, log)
        stream.close()
        second, url, log = start_server(workdir, config)
        try:
            alice = sdk(url, "unused")
            turn = alice.get_session(session.id).get_turn(turn_id)
            # Read with a deadline far under the lease time: a turn whose lease was not
            # handed over would still be waiting when it passes.
            rest = []
            after = seen[-1].sequence_number
            reader = threading.Thread(target=lambda: rest.extend(turn.stream(after_sequence_number=after)), daemon=True)
            reader.start()
            reader.join(timeout=120)
            self.assertFalse(reader.is_alive(), "the turn is still waiting for its lease to lapse")
            self.assertIsInstance(rest[-1].event, TurnDoneEvent)
            self.assertEqual(rest[-1].event.state.status, "done")
            seqs = [item.sequence_number for item in seen + rest]
            self.assertEqual(seqs, sorted(set(seqs)), "no event twice across the restart")
        finally:
            second.send_signal(signal.SIGTERM)
            self.assertEqual(second.wait(timeout=30), 0)
            second.stdout.close()
            log.close()


class Terminal:
    """``agentry chat`` under a pseudo-terminal: type lines, read until text appears."""

    def __init__(self, *args):
        env = dict(os.environ, AGENTRY_API_KEY=ALICE, NO_COLOR="1")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(os.environ["AGENTRY_BIN"], [os.environ["AGENTRY_BIN"], *args], env)
        self.output = ""

    def expect(self, text, timeout=30):
        deadline = time.monotonic() + timeout
        while text not in self.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.output}")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the chat ended before {text!r}; it showed:\n{self.output}")
                self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        # Everything up to the match is consumed, so the next expect looks further on.
        seen = self.output.index(text) + len(text)
        consumed, self.output = self.output[:seen], self.output[seen:]
        return consumed

    def type(self, line):
        os.write(self.fd, (line + "\n").encode())

    def interrupt(self):
        os.write(self.fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT

    def close(self):
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


class Chat(unittest.TestCase):
    def test_chat_streams_asks_for_approval_and_answers_questions(self):
        terminal = Terminal("chat", "demo", "--url", SERVER["url"])
        banner = terminal.expect("you> ")
        self.assertIn("Chatting with demo in session", banner)
        terminal.type("hello terminal")
        self.assertIn("agent> Echo: hello terminal", terminal.expect("you> "))
        terminal.type("calculate 6 * 7")
        shown = terminal.expect("you> ")
        self.assertIn('→ calculator({"expression":"6 * 7"})', shown)
        self.assertIn("← 42", shown)
        self.assertIn("The result is 42.", shown)
        terminal.type("please email the team")
        self.assertIn("Allow send_email(", terminal.expect("[y/n] "))
        terminal.type("y")
        shown = terminal.expect("you> ")
        self.assertIn("← Sent to team@example.com.", shown)
        self.assertIn("Email sent.", shown)
        terminal.type("send another email")
        terminal.expect("[y/n] ")
        terminal.type("maybe")
        terminal.expect("[y/n] ")  # asked again
        terminal.type("n")
        terminal.expect("Reason (optional): ")
        terminal.type("too many emails")
        self.assertIn("Email not sent: too many emails.", terminal.expect("you> "))
        terminal.type("ask me anything")
        asked = terminal.expect("answer> ")
        self.assertIn("? Which color do you like best?", asked)
        self.assertIn("2. green", asked)
        terminal.type("2")
        self.assertIn("You chose green.", terminal.expect("you> "))
        # Ctrl-C while the agent streams cancels the turn; the chat goes on.
        terminal.type("slow please")
        terminal.expect("agent> ")
        terminal.interrupt()
        shown = terminal.expect("you> ")
        self.assertIn("(cancelling…)", shown)
        self.assertIn("(turn cancelled: client-cancelled)", shown)
        terminal.type("still there?")
        self.assertIn("Echo: still there?", terminal.expect("you> "))
        terminal.type("/quit")
        self.assertEqual(terminal.close(), 0)

    def restart_under_chat(self, grace):
        """Runs ``agentry chat`` on a server that is stopped (SIGTERM, ``grace`` seconds of
        shutdown grace) while it streams a ~10 s answer, then restarted on its port; returns
        what the chat shows up to its next prompt."""
        # A fixed port, so the chat reconnects to the restarted server where it was.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        sections = f"[limits]\nshutdown_grace_secs = {grace}\n[runtime]\nlease_ttl_secs = 300\n"
        workdir, config = write_config("chat-restart", sections, listen=f"127.0.0.1:{port}")
        first, url, log = start_server(workdir, config)
        try:
            terminal = Terminal("chat", "demo", "--url", url)
            terminal.expect("you> ")
            terminal.type("slow please")
            terminal.expect("agent> ")
            first.send_signal(signal.SIGTERM)
            self.assertEqual(first.wait(timeout=60), 0)
        finally:
            if first.poll() is None:
                first.kill()
            closed(first, log)
        second, url, log = start_server(workdir, config)
        try:
            shown = terminal.expect("you> ", timeout=60)
            terminal.type("/quit")
            self.assertEqual(terminal.close(), 0)
            return shown
        finally:
            second.send_signal(signal.SIGTERM)
            self.assertEqual(second.wait(timeout=30), 0)
            second.stdout.close()
            log.close()

    def test_a_second_ctrl_c_leaves_even_while_the_server_does_not_answer(self):
        workdir, config = write_config("chat-frozen", "")
        server, url, log = start_server(workdir, config)
        try:
            terminal = Terminal("chat", "demo", "--url", url)
            terminal.expect("you> ")
            terminal.type("slow please")
            terminal.expect("agent> ")
            server.send_signal(signal.SIGSTOP)  # it answers nothing, not even the cancel
            terminal.interrupt()
            terminal.expect("(cancelling…)")
            terminal.interrupt()
            # The chat leaves at once: its terminal closes, well before any timeout.
            with self.assertRaisesRegex(AssertionError, "the chat ended"):
                terminal.expect("never shown", timeout=20)
            self.assertEqual(terminal.close(), 130)
        finally:
            server.send_signal(signal.SIGCONT)
            server.send_signal(signal.SIGTERM)
            closed(server, log)

    def test_a_second_signal_stops_the_server_at_once_and_the_chat_says_where_to_follow_the_turn(self):
        # An hour's grace, cut short by a second SIGTERM: the server exits with its turn
        # running (handed over), and the chat, finding no server to resume from, says how to
        # follow the kept turn.
        workdir, config = write_config("chat-forced", "[limits]\nshutdown_grace_secs = 3600\n")
        server, url, log = start_server(workdir, config)
        try:
            terminal = Terminal("chat", "demo", "--url", url)
            terminal.expect("you> ")
            terminal.type("slow please")
            terminal.expect("agent> ")
            server.send_signal(signal.SIGTERM)
            # Two signals, not one: the second is sent once the first was heard (the server
            # stops listening at once) and more than a second after it (a signal within a
            # second of the one before is taken for the same, forwarded twice).
            signalled = time.monotonic()
            port = int(url.rsplit(":", 1)[1])
            while time.monotonic() < signalled + 30:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    break
            time.sleep(max(0.0, signalled + 1.2 - time.monotonic()))  # the one-second window is the behaviour under test
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0)
        finally:
            if server.poll() is None:
                server.kill()
            closed(server, log)
        shown = terminal.expect("you> ", timeout=60)
        self.assertIn("the turn's stream could not be resumed", shown)
        self.assertIn("agentry events ", shown)
        self.assertIn(" --follow", shown)
        terminal.type("/quit")
        self.assertEqual(terminal.close(), 0)

    def test_chat_says_when_a_restart_interrupts_an_answer(self):
        # The answer outlasts the grace: the turn is handed over, and the next server
        # answers again from the start.
        shown = self.restart_under_chat(grace=1)
        note = "(interrupted: the server stopped mid-answer; it answers again)"
        self.assertIn(note, shown)
        # What follows the note is the whole answer, streamed again.
        again = shown.split(note, 1)[1].strip().splitlines()[0]
        self.assertTrue(again.startswith("agent> "), shown)
        self.assertEqual(len(again.removeprefix("agent> ")), 200, shown)

    def test_chat_shows_the_whole_answer_when_it_ends_during_the_shutdown_grace(self):
        # The answer ends within the grace while the chat is disconnected: its rest comes
        # back only in the stored model.message, and is shown from it.
        shown = self.restart_under_chat(grace=30)
        self.assertNotIn("interrupted", shown)
        # The line began with the first delta ("agent> " was read then), and holds it all.
        self.assertEqual(len(shown.splitlines()[0]), 200, shown)

    def test_chat_follows_sub_agent_threads(self):
        terminal = Terminal("chat", "demo-team", "--url", SERVER["url"])
        terminal.expect("you> ")
        terminal.type("beavers")
        shown = terminal.expect("you> ")
        self.assertIn("[researcher] started on thread", shown)
        self.assertIn("[writer] started on thread", shown)
        self.assertIn("[researcher] Research notes on: beavers", shown)
        self.assertIn("[writer] done", shown)
        self.assertIn("The team answered.", shown)
        terminal.type("/quit")
        self.assertEqual(terminal.close(), 0)


class Cli(unittest.TestCase):
    def left_waiting(self, agent, stdin):
        """Chats with `agent` until its input ends at a question; the run and the session
        id the chat says to take up again."""
        done = self.agentry("chat", agent, stdin=stdin)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("left with the turn waiting for an answer", done.stderr)
        return done, done.stderr.split("--session ")[1].split("`")[0]

    def agentry(self, *args, stdin=None, stdout=subprocess.PIPE, **extra_env):
        env = dict(os.environ, AGENTRY_API_KEY=ALICE, NO_COLOR="1", **extra_env)
        return subprocess.run(
            [os.environ["AGENTRY_BIN"], *args, "--url", SERVER["url"]],
            input=stdin, stdout=stdout, stderr=subprocess.PIPE, env=env, text=True, timeout=60,
        )

    def test_a_listing_whose_reader_went_away_ends_quietly(self):
        client().create_session(agent_name="demo")
        # The reading end is closed before the command starts, so its first line already
        # finds nobody to read it (as `agentry sessions list | head -0` would).
        read, write = os.pipe()
        os.close(read)
        try:
            done = self.agentry("sessions", "list", "--agent", "demo", stdout=write)
        finally:
            os.close(write)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("panicked", done.stderr)

    def test_serve_takes_the_store_backend_and_warns_of_a_file_named_for_the_other(self):
        workdir = tempfile.mkdtemp(prefix="backend-", dir=WORKDIRS)
        cases = (
            ("chosen.redb", ["--backend", "redb"], b"redb", None),
            ("named.redb", [], b"SQLite format 3", "the store's file name says redb, but the backend is sqlite"),
            ("named.db", ["--backend", "redb"], b"redb", "the store's file name says sqlite, but the backend is redb"),
        )
        for name, extra, magic, warning in cases + (("agentry.redb", ["--backend", "redb"], b"redb", None),):
            path = os.path.join(workdir, name)
            # The last case names no file: the default one is named for its backend.
            store = ["--store", path] if name != "agentry.redb" else []
            with open(os.path.join(workdir, f"{name}.log"), "w+") as log:
                process = subprocess.Popen(
                    [os.environ["AGENTRY_BIN"], "serve", "--listen", "127.0.0.1:0", *store, *extra],
                    stdout=subprocess.PIPE, stderr=log, cwd=workdir, text=True,
                    env=dict(os.environ, RUST_LOG="info", NO_COLOR="1"),
                )
                line = process.stdout.readline()
                if not line.startswith("agentry listening on "):
                    process.kill()
                    process.wait()
                    log.seek(0)
                    self.fail(f"serve did not start ({name}): {line!r}; its log:\n{log.read()}")
                url = line.strip().rsplit(" ", 1)[1]
                with httpx.Client(base_url=url, timeout=60) as h:
                    self.assertEqual(h.post("/v1/agents/sessions", json={"agent_name": "demo"}).status_code, 200)
                process.send_signal(signal.SIGTERM)
                self.assertEqual(process.wait(timeout=30), 0)
                process.stdout.close()
                log.seek(0)
                logged = log.read()
            with open(path, "rb") as f:
                self.assertTrue(f.read(16).startswith(magic), name)
            backend = "redb" if extra else "sqlite"
            self.assertIn(f"backend={backend}", logged)
            self.assertEqual("the store's file name says" in logged, warning is not None, logged)
            if warning:
                self.assertIn(warning, logged)

    def test_a_session_is_cancelled_and_deleted_from_the_command_line(self):
        session = client().create_session(agent_name="demo")
        with http() as h:
            turns = f"/v1/agents/sessions/{session.id}/turns"
            running = h.post(turns, json={"input": [{"type": "user.message", "content": "slow"}]}).json()["data"]["id"]
            refused = self.agentry("sessions", "delete", session.id)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn(running, refused.stderr)
            done = self.agentry("sessions", "cancel", session.id)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(h.get(f"{turns}/{running}").json()["data"]["state"]["status"], "cancelled")
        done = self.agentry("sessions", "delete", session.id)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout), {"type": "session", "id": session.id, "deleted": True})
        with http() as h:
            self.assertEqual(h.get(f"/v1/agents/sessions/{session.id}").status_code, 404)
        again = self.agentry("sessions", "delete", session.id)
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("not found", again.stderr)

    def test_a_server_url_that_is_not_one_is_refused_before_anything_is_sent(self):
        for url in ("not-a-url", "ftp://127.0.0.1:8787", "127.0.0.1:8787"):
            done = subprocess.run(
                [os.environ["AGENTRY_BIN"], "sessions", "list", "--agent", "demo", "--url", url],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60,
            )
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertIn(f"invalid value '{url}' for '--url <URL>': an http:// or https:// URL", done.stderr)

    def test_a_listing_limit_must_be_at_least_one(self):
        done = self.agentry("sessions", "list", "--agent", "demo", "--limit", "0")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("invalid value '0' for '--limit <LIMIT>': a whole number of at least 1 is needed", done.stderr)
        self.assertEqual(done.stdout, "")
        listed = self.agentry("sessions", "list", "--agent", "demo", "--limit", "1")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertLessEqual(len(listed.stdout.splitlines()), 1)

    def test_sessions_are_listed_in_either_order_within_a_time_range(self):
        made = [client().create_session(agent_name="demo").id for _ in range(3)]
        newest = self.agentry("sessions", "list", "--agent", "demo", "--limit", "3")
        self.assertEqual(newest.returncode, 0, newest.stderr)
        newest_ids = [json.loads(line)["id"] for line in newest.stdout.splitlines()]
        self.assertEqual(newest_ids, made[::-1])
        since = json.loads(newest.stdout.splitlines()[-1])["created_at"]
        oldest = self.agentry("sessions", "list", "--agent", "demo", "--oldest-first", "--since", since)
        self.assertEqual(oldest.returncode, 0, oldest.stderr)
        self.assertEqual([json.loads(line)["id"] for line in oldest.stdout.splitlines()], made)
        bad = self.agentry("sessions", "list", "--agent", "demo", "--until", "yesterday")
        self.assertEqual(bad.returncode, 1, bad.stderr)
        self.assertIn("end_timestamp", bad.stderr)

    def test_a_refused_request_is_reported_without_a_backtrace(self):
        # A session id that does not exist: the server answers 404. A backtrace is for
        # crashes, not for refused requests, also with RUST_BACKTRACE set.
        missing = "00000000-0000-7000-8000-000000000000"
        done = self.agentry("turns", "list", missing, RUST_BACKTRACE="1")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertTrue(done.stderr.startswith("error: "), done.stderr)
        self.assertIn(missing, done.stderr)
        self.assertNotIn("backtrace", done.stderr.lower())
        self.assertNotIn("panicked", done.stderr)

    def test_chat_refuses_a_session_of_another_agent(self):
        session = client().create_session(agent_name="demo")
        done = self.agentry("chat", "demo-team", "--session", session.id, stdin="hello\n")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn(f"session {session.id} belongs to agent \"demo\", not \"demo-team\"", done.stderr)
        self.assertNotIn("Chatting with", done.stdout)

    def test_chat_says_so_when_its_input_ends_at_a_question(self):
        done, session = self.left_waiting("demo", "please email the team\n")
        self.assertIn("Allow send_email(", done.stdout)
        # The command it suggests asks the question again, before any message.
        again = self.agentry("chat", "demo", "--session", session, stdin="y\nhello after\n/quit\n")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("Allow send_email(", again.stdout)
        self.assertIn("Email sent.", again.stdout)
        self.assertIn("Echo: hello after", again.stdout)
        # Answers it does not take say what it does; a session id must be one.
        asked = self.agentry("chat", "demo", stdin="ask me\n7\nteal\n/quit\n")
        self.assertIn("(choose 1 to 3, or type an answer)", asked.stdout)
        self.assertIn("You chose teal.", asked.stdout)
        odd = self.agentry("chat", "demo", "--session", f"{session}?x=1", stdin="hi\n")
        self.assertEqual(odd.returncode, 2, odd.stderr)
        self.assertIn("an id is a UUID", odd.stderr)
        # So must the ids the other commands take, checked before anything is sent.
        for args in (("turns", "list", "not-a-uuid"), ("events", "not-a-uuid")):
            odd = self.agentry(*args)
            self.assertEqual(odd.returncode, 2, odd.stderr)
            self.assertIn("invalid value 'not-a-uuid'", odd.stderr)
            self.assertIn("an id is a UUID", odd.stderr)

    def test_chat_names_a_members_call_when_it_takes_up_a_waiting_session(self):
        done, session = self.left_waiting("demo-team", "email the plan\n")
        self.assertIn("[writer] → send_email(", done.stdout)
        # Taken up again, the chat names the member's call it asks about and the member
        # that goes on, which only the turn's stored events carry.
        again = self.agentry("chat", "demo-team", "--session", session, stdin="y\n/quit\n")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn('Allow send_email({"body":"email the plan"', again.stdout)
        self.assertIn("[writer] Draft about: email the plan (emailed)", again.stdout)
        self.assertIn("[writer] done", again.stdout)
        self.assertIn("writer: Draft about: email the plan (emailed)", again.stdout)

    def test_chat_survives_bad_input_and_shows_control_characters_as_escapes(self):
        env = dict(os.environ, AGENTRY_API_KEY=ALICE, NO_COLOR="1")
        lines = b"bad \xff byte\n" + b"x" * (9 * 1024 * 1024) + b"\n" + b"paint \x1b[31mred\x07\n/quit\n"
        done = subprocess.run(
            [os.environ["AGENTRY_BIN"], "chat", "demo", "--url", SERVER["url"]],
            input=lines, capture_output=True, env=env, timeout=120,
        )
        out = done.stdout.decode()
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        self.assertIn("Echo: bad \ufffd byte", out)
        # The message too large to send is reported (the server refuses it as the body
        # arrives), and the chat goes on.
        self.assertEqual(out.count("error: "), 1, out)
        # The echo comes back with the escape and the bell shown, not sent to the terminal.
        self.assertIn("Echo: paint \\u{1b}[31mred\\u{7}", out)
        self.assertNotIn("\x1b", out)
        self.assertNotIn("\x07", out)


class BadInput(unittest.TestCase):
    def assert_error(self, response, status):
        self.assertEqual(response.status_code, status, response.text)
        body = response.json()
        self.assertIsInstance(body["error"]["message"], str)
        self.assertTrue(body["error"]["message"])

    def test_bad_requests_get_sdk_shaped_errors_and_the_server_keeps_serving(self):
        with http() as h:
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            turns = f"/v1/agents/sessions/{sid}/turns"
            self.assert_error(h.post(turns, content=b"{not json", headers={"content-type": "application/json"}), 400)
            self.assert_error(h.post(turns, json={"input": "hello"}), 400)
            # A body is an object: an array is not taken as its fields in order.
            as_array = h.post("/v1/agents/sessions", json=["demo", "a title"])
            self.assert_error(as_array, 400)
            self.assertIn("must be a JSON object", as_array.json()["error"]["message"])
            self.assert_error(h.post(turns, json=[[{"type": "user.message", "content": "hi"}]]), 400)
            self.assertEqual(h.get(turns).json()["data"], [], "nothing was run")
            self.assert_error(h.post(turns, json={"input": [{"type": "user.nonsense"}]}), 400)
            self.assert_error(h.post("/v1/agents/sessions", json={"agent_name": 42}), 400)
            # A title is at most 1,000 characters (characters, not bytes).
            long_title = h.post("/v1/agents/sessions", json={"agent_name": "demo", "title": "x" * 1001})
            self.assert_error(long_title, 400)
            self.assertEqual(long_title.json()["error"]["param"], "title", long_title.text)
            self.assertIn("at most 1000", long_title.json()["error"]["message"])
            self.assertEqual(h.post("/v1/agents/sessions", json={"agent_name": "demo", "title": "é" * 1000}).status_code, 200)
            long_thread = h.post("/agui/demo", json={"threadId": "t" * 1001, "runId": "r", "messages": [{"id": "m", "role": "user", "content": "hi"}]})
            self.assert_error(long_thread, 400)
            self.assertEqual(long_thread.json()["error"]["param"], "threadId", long_thread.text)
            self.assert_error(h.post("/v1/agents/sessions", json={"agent_name": "ghost"}), 404)
            self.assert_error(h.get("/v1/agents/sessions/not-a-session"), 404)
            # An id of 20,000 bytes is not repeated whole in the error.
            long = h.get("/v1/agents/sessions/" + "x" * 20000)
            self.assert_error(long, 404)
            self.assertLess(len(long.json()["error"]["message"]), 200, long.text[:300])
            self.assertIn("(20000 bytes)", long.json()["error"]["message"])
            self.assert_error(h.get("/v1/agents/sessions/01a20000-0000-7000-8000-000000000000"), 404)
            self.assert_error(h.get(f"{turns}/01a20000-0000-7000-8000-000000000000"), 404)
            self.assert_error(h.get("/v1/agents/sessions", params={"agent_name": "demo", "limit": "many"}), 400)
            self.assert_error(h.get("/v1/agents/sessions", params={"agent_name": "demo", "page_token": "junk"}), 400)
            self.assert_error(h.get("/v1/agents/sessions"), 400)
            mixed = [
                {"type": "user.message", "content": "hi"},
                {"type": "user.tool_response", "thread_id": "main", "tool_call_id": "x", "content": "y"},
            ]
            self.assert_error(h.post(turns, json={"input": mixed}), 400)
            bad_file = {"type": "file", "name": "a.txt", "data": "data:text/plain;base64,@@@"}
            self.assert_error(h.post(turns, json={"input": [{"type": "user.message", "content": [bad_file]}]}), 400)
            self.assert_error(h.post(turns, json={"input": [{"type": "user.message", "content": "x" * BODY_LIMIT}]}), 413)
            ok = h.post(turns, json={"input": [{"type": "user.message", "content": "fine"}], "stream": False})
            self.assertEqual(ok.status_code, 200, ok.text)
            tid = ok.json()["data"]["id"]
            subscribe = f"{turns}/{tid}/subscribe"
            self.assert_error(h.post(subscribe, json={}, headers={"Last-Event-ID": "abc"}), 400)
            # An empty cursor is none: the whole turn again.
            with h.stream("POST", subscribe, json={}, headers={"Last-Event-ID": ""}) as replay:
                self.assertEqual(replay.status_code, 200)
                frames = [line for line in replay.iter_lines() if line.startswith("data:")]
            self.assertIn('"turn.created"', frames[0])
            # The ended turn's last cursor gives an empty stream; one past it is refused,
            # naming where it came from, not answered as if nothing more would come.
            last = int([line for line in replay_ids(h, subscribe)][-1])
            with h.stream("POST", subscribe, json={"after_sequence_number": last}) as rest:
                self.assertEqual(rest.status_code, 200)
                self.assertEqual([line for line in rest.iter_lines() if line.startswith("data:")], [])
            past = h.post(subscribe, json={"after_sequence_number": last + 1})
            self.assert_error(past, 400)
            self.assertEqual(past.json()["error"]["param"], "after_sequence_number", past.text)
            self.assertIn(f"last event, {last}", past.json()["error"]["message"])
            past = h.post(subscribe, json={}, headers={"Last-Event-ID": str(last + 1)})
            self.assert_error(past, 400)
            self.assertEqual(past.json()["error"]["param"], "Last-Event-ID", past.text)
            # The session events have one order; asking for another is refused, not ignored.
            ordered = h.get(f"/v1/agents/sessions/{sid}/events", params={"order": "asc"})
            self.assert_error(ordered, 400)
            self.assertEqual(ordered.json()["error"]["param"], "order")
            for order in ("desc", "DESC"):
                self.assertEqual(h.get(f"/v1/agents/sessions/{sid}/events", params={"order": order}).status_code, 200)
            self.assertEqual(h.get(f"{turns}/{tid}/events", params={"order": "ASC"}).status_code, 200)
            # ISO-8601 dates and date-times (without seconds, without an offset: UTC, with a
            # compact offset) filter listings.
            stamps = ("2026-01-02", "2026-01-02T03:04", "2026-01-02T03:04:05", "2026-01-02 03:04:05.5+01:00", "2026-01-02T03:04+0100")
            for stamp in stamps:
                listed = h.get("/v1/agents/sessions", params={"agent_name": "demo", "start_timestamp": stamp})
                self.assertEqual(listed.status_code, 200, (stamp, listed.text))
            # They mean what they say: nothing starts after 2999, everything after 2000.
            after = lambda stamp: h.get("/v1/agents/sessions", params={"agent_name": "demo", "start_timestamp": stamp}).json()["data"]
            self.assertEqual(after("2999-01-01T00:00"), [])
            self.assertNotEqual(after("2000-01-01T00:00+0100"), [])
            unclear = h.get("/v1/agents/sessions", params={"agent_name": "demo", "start_timestamp": "2026-13-02"})
            self.assert_error(unclear, 400)
            self.assertEqual(unclear.json()["error"]["param"], "start_timestamp")
            # A `+` sent unencoded reads as a space: the error says how to send it.
            plus = h.get("/v1/agents/sessions?agent_name=demo&start_timestamp=2026-01-02T03:04:05+01:00")
            self.assert_error(plus, 400)
            self.assertIn("%2B", plus.json()["error"]["message"])
            # A range that ends before it starts is refused, not answered with nothing.
            reversed_range = {"agent_name": "demo", "start_timestamp": "2027-01-01", "end_timestamp": "2026-01-01"}
            backwards = h.get("/v1/agents/sessions", params=reversed_range)
            self.assert_error(backwards, 400)
            self.assertEqual(backwards.json()["error"]["param"], "end_timestamp")
            self.assert_error(h.post(subscribe, json={"after_sequence_number": "x"}), 400)
            # A body error inside one field names it.
            negative = h.post(subscribe, json={"after_sequence_number": -1})
            self.assert_error(negative, 400)
            self.assertEqual(negative.json()["error"].get("param"), "after_sequence_number", negative.text)
            missing = h.post("/v1/agents/sessions", json={})
            self.assert_error(missing, 400)
            self.assertEqual(missing.json()["error"].get("param"), "agent_name", missing.text)
            bad_part = h.post(turns, json={"input": [{"type": "user.message", "content": [bad_file]}]})
            self.assertTrue(bad_part.json()["error"].get("param", "").startswith("input[0]"), bad_part.text)
            self.assert_error(h.get(f"{turns}/{tid}/events", params={"page_token": "@@"}), 400)
            self.assert_error(h.put("/v1/agents/sessions"), 405)
            # Turns chain in a line: naming a turn that is not the latest is refused, and the
            # error names the parameter.
            again = {"input": [{"type": "user.message", "content": "again"}], "stream": False}
            self.assertEqual(h.post(turns, json=again).status_code, 200)
            wait_until_idle(h, turns)
            stale = {"input": [{"type": "user.message", "content": "x"}], "previous_turn_id": tid, "stream": False}
            refused = h.post(turns, json=stale)
            self.assert_error(refused, 400)
            self.assertEqual(refused.json()["error"].get("param"), "previous_turn_id", refused.text)
            self.assertEqual(h.get("/healthz").status_code, 200)
            self.assertEqual(h.get("/readyz").status_code, 200)
            self.assertEqual(h.get(f"/v1/agents/sessions/{sid}").status_code, 200)

    def test_page_tokens_belong_to_their_listing(self):
        with http() as h:
            for _ in range(2):
                h.post("/v1/agents/sessions", json={"agent_name": "demo"})
            listed = h.get("/v1/agents/sessions", params={"agent_name": "demo", "limit": 1}).json()
            token = listed["pagination"]["next_page_token"]
            same = h.get("/v1/agents/sessions", params={"agent_name": "demo", "limit": 1, "page_token": token})
            self.assertEqual(same.status_code, 200, same.text)
            for other in [{"agent_name": "demo-team"}, {"agent_name": "demo", "order": "asc"}]:
                self.assert_error(h.get("/v1/agents/sessions", params={**other, "page_token": token}), 400)
            session = client().create_session(agent_name="demo")
            run(session, message("calculate 6 * 7"))
            sid, tid = session.id, next(iter(session.list_turns())).id
            events = h.get(f"/v1/agents/sessions/{sid}/turns/{tid}/events", params={"limit": 1}).json()
            token = events["pagination"]["next_page_token"]
            self.assertTrue(token, events)
            self.assert_error(h.get(f"/v1/agents/sessions/{sid}/events", params={"page_token": token}), 400)
            # A token of another session's listing is answered as one naming no turn at all:
            # the answer does not tell whether a turn of another session exists.
            page = h.get(f"/v1/agents/sessions/{sid}/events", params={"limit": 1}).json()
            theirs = page["pagination"]["next_page_token"]
            self.assertTrue(theirs, page)
            padded = theirs + "=" * (-len(theirs) % 4)
            cursor = json.loads(base64.urlsafe_b64decode(padded))
            cursor["turn_id"] = str(uuid.uuid4())
            unknown = base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode().rstrip("=")
            other = client().create_session(agent_name="demo")
            run(other, message("calculate 1 + 1"))
            answers = []
            for candidate in (theirs, unknown):
                refused = h.get(f"/v1/agents/sessions/{other.id}/events", params={"page_token": candidate})
                self.assert_error(refused, 400)
                answers.append(refused.json()["error"]["message"])
            self.assertEqual(answers[0], answers[1], answers)
            self.assertNotIn("another session", answers[0])

    def test_sse_hygiene_headers(self):
        with http() as h:
            sid = h.post("/v1/agents/sessions", json={"agent_name": "demo"}).json()["data"]["id"]
            body = {"input": [{"type": "user.message", "content": "hi"}], "stream": True}
            with h.stream("POST", f"/v1/agents/sessions/{sid}/turns", json=body) as response:
                self.assertEqual(response.headers["content-type"], "text/event-stream")
                self.assertEqual(response.headers["cache-control"], "no-cache")
                self.assertEqual(response.headers["x-accel-buffering"], "no")
                self.assertNotIn(response.headers.get("content-encoding", "identity"), ("gzip", "br", "deflate"))
                response.read()

    def test_metrics_count_turns(self):
        session = client().create_session(agent_name="demo")
        run(session, message("count me"))
        with http() as h:
            text = h.get("/metrics").text
        self.assertIn('agentry_turns_finished_total{status="done"}', text)
        self.assertIn("agentry_sse_clients", text)
        self.assertIn("agentry_store_read_seconds", text)


def feed_frames(h, path, count=None, until=None, headers=None, connected=None, params=None):
    """Reads SSE frames of a feed: (id, json) pairs, heartbeats skipped; sets the
    ``connected`` event when the feed's first frame arrives."""
    frames = []
    with h.stream("GET", path, headers=headers or {}, params=params) as response:
        assert response.status_code == 200, response.read()
        event_id, data = None, []
        for line in response.iter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                frame = json.loads("\n".join(data))
                data = []
                if frame["type"] != "server.heartbeat":
                    frames.append((event_id, frame))
                if connected is not None and frame["type"] == "server.connected":
                    connected.set()
                event_id = None
                if until and until(frame):
                    return frames
                if count and len(frames) >= count:
                    return frames
    return frames


class Feeds(unittest.TestCase):
    def test_a_cursor_past_the_newest_event_follows_from_the_live_edge(self):
        # A Last-Event-ID kept from a store since recreated is far past this store's events:
        # the feed follows from its newest event rather than waiting to reach the cursor.
        session = client().create_session(agent_name="demo")
        connected = threading.Event()
        frames = []

        def listen():
            with http() as h:
                path = f"/event?session_id={session.id}"
                until = lambda f: f["type"] == "turn.done"  # noqa: E731
                headers = {"Last-Event-ID": "99999999999"}
                frames.extend(feed_frames(h, path, until=until, connected=connected, headers=headers))

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        self.assertTrue(connected.wait(timeout=30), "the feed connected")
        run(session, message("hello there"))
        listener.join(timeout=30)
        self.assertFalse(listener.is_alive(), "the feed delivered the turn")
        kinds = [f["type"] for _, f in frames]
        self.assertEqual(kinds[0], "server.connected")
        self.assertIn("turn.created", kinds)
        self.assertIn("turn.done", kinds)

    def test_global_feed_carries_a_spawn_and_resumes_without_gaps(self):
        alice = client()
        session = alice.create_session(agent_name="demo-team")
        done = threading.Event()
        connected = threading.Event()
        frames = []

        def listen():
            with http() as h:
                frames.extend(
                    feed_frames(
                        h,
                        "/global/event",
                        until=lambda f: f["type"] == "agent_team.instance.completed",
                        connected=connected,
                    )
                )
            done.set()

        # Without a cursor the feed starts at the live edge: connect first, then run the turn.
        listener = threading.Thread(target=listen)
        listener.start()
        self.assertTrue(connected.wait(timeout=30), "the feed connected")
        run(session, message("please spawn an analyst"))
        listener.join(timeout=60)
        self.assertTrue(done.is_set(), "the feed delivered the spawn")
        self.assertEqual(frames[0][1]["type"], "server.connected")
        kinds = [f["type"] for _, f in frames]
        for kind in (
            "agent_team.spawn.requested",
            "agent_team.spawn.approved",
            "agent_team.instance.started",
            "agent_team.instance.completed",
        ):
            self.assertIn(kind, kinds)
        started = next(f for _, f in frames if f["type"] == "agent_team.instance.started")["properties"]
        self.assertEqual(started["sessionID"], session.id)
        self.assertEqual(started["role"], "analyst")
        numbered = [(int(i), f) for i, f in frames if i is not None]
        positions = [p for p, _ in numbered]
        self.assertEqual(positions, sorted(set(positions)), "positions increase")
        # Resume from the second numbered frame: exactly the frames after it, again.
        cut = positions[1]
        with http() as h:
            resumed = feed_frames(
                h,
                "/global/event",
                until=lambda f: f["type"] == "agent_team.instance.completed",
                headers={"Last-Event-ID": str(cut)},
            )
        self.assertEqual(resumed[0][1]["type"], "server.connected")
        again = [(int(i), f) for i, f in resumed if i is not None]
        self.assertEqual(again, [(p, f) for p, f in numbered if p > cut])
        # The session feed has the same events of that session; another subject sees none.
        with http() as h:
            own = feed_frames(
                h,
                f"/event?session_id={session.id}&after=0",
                until=lambda f: f["type"] == "agent_team.instance.completed",
            )
        self.assertIn("agent_team.spawn.approved", [f["type"] for _, f in own])
        with http(BOB) as h:
            self.assertEqual(h.get(f"/event?session_id={session.id}").status_code, 404)
            instances = h.get("/v1/agent-team/instances").json()["data"]
            self.assertEqual(instances, [])
        # Cursors are read alike in the header and the query: trimmed, digits only; an
        # empty session_id is a missing one.
        with http() as h:
            for bad in ("+1", "-1", "1.0", "0x1"):
                refused = h.get("/global/event", params={"after": bad})
                self.assertEqual(refused.status_code, 400, (bad, refused.text))
                self.assertEqual(refused.json()["error"]["param"], "after")
            empty = h.get("/event", params={"session_id": ""})
            self.assertEqual(empty.status_code, 400, empty.text)
            self.assertEqual(empty.json()["error"]["param"], "session_id")
            spaced = feed_frames(
                h,
                "/global/event",
                until=lambda f: f["type"] == "agent_team.instance.completed",
                params={"after": f" {cut} "},
            )
            self.assertEqual([(int(i), f) for i, f in spaced if i is not None], [(p, f) for p, f in numbered if p > cut])
        with http() as h:
            instances = h.get("/v1/agent-team/instances", params={"status": "completed"}).json()["data"]
            self.assertIn(started["instanceID"], [i["instanceID"] for i in instances])
            missions = h.get("/v1/agent-team/missions").json()["data"]
            mission = next(m for m in missions if m["missionID"] == started["missionID"])
            self.assertEqual(mission["status"], "completed", "the mission ended with its turn")
            self.assertEqual(mission["instances"], 1)
            self.assertIsInstance(mission["tokensUsed"], int)
            self.assertGreater(mission["tokensUsed"], 0)
            completed = h.get("/v1/agent-team/missions", params={"status": "completed"}).json()["data"]
            self.assertIn(started["missionID"], [m["missionID"] for m in completed])
            active = h.get("/v1/agent-team/missions", params={"status": "active"}).json()["data"]
            self.assertNotIn(started["missionID"], [m["missionID"] for m in active])
            bad = h.get("/v1/agent-team/missions", params={"status": "done"})
            self.assertEqual(bad.status_code, 400, bad.text)
            self.assertEqual(bad.json()["error"]["param"], "status")
            templates = h.get("/v1/agent-team/templates").json()["data"]
            self.assertIn(("demo-team", "analyst"), [(t["team"], t["role"]) for t in templates])


    def test_operator_spawns_through_the_api_with_and_without_approval(self):
        alice = client()
        session = alice.create_session(agent_name="demo-team")

        def finish(turn_id):
            events = [item.event for item in session.get_turn(turn_id).stream(after_sequence_number=0)]
            self.assertIsInstance(events[-1], TurnDoneEvent)
            return events

        with http() as h:
            spawned = h.post(
                "/v1/agent-team/spawn",
                json={"session_id": session.id, "role": "analyst", "task": "size the market", "justification": "ops"},
            )
            self.assertEqual(spawned.status_code, 202, spawned.text)
            first = spawned.json()["turnID"]
            self.assertIn("The analyst instance answered: Analysis of: size the market", merged_text(finish(first)))

            # An auditor waits for a person's approval: approve one, deny two (one with a
            # reason, one with a blank one, which reads as none).
            decisions = []
            for decision, body in (("approve", {}), ("deny", {"reason": "not needed"}), ("deny", {"reason": "  "})):
                spawned = h.post("/v1/agent-team/spawn", json={"session_id": session.id, "role": "auditor", "task": f"audit {decision}"})
                self.assertEqual(spawned.status_code, 202, spawned.text)
                pending = h.get("/v1/agent-team/approvals", params={"wait_secs": 30}).json()["data"]
                self.assertEqual([p["role"] for p in pending], ["auditor"])
                with http(BOB) as other:
                    self.assertEqual(other.get("/v1/agent-team/approvals").json()["data"], [])
                    refused = other.post(f"/v1/agent-team/approvals/{pending[0]['approvalID']}/approve")
                    self.assertEqual(refused.status_code, 404)
                decided = h.post(f"/v1/agent-team/approvals/{pending[0]['approvalID']}/{decision}", json=body)
                self.assertEqual(decided.status_code, 200, decided.text)
                decisions.append(merged_text(finish(spawned.json()["turnID"])))
                # A decision is made once: a second one (either) is told what the first was,
                # and another subject still learns nothing of the approval.
                first = "approved" if decision == "approve" else "denied"
                for second in ("approve", "deny"):
                    again = h.post(f"/v1/agent-team/approvals/{pending[0]['approvalID']}/{second}", json={})
                    self.assertEqual(again.status_code, 409, again.text)
                    self.assertEqual(again.json()["error"]["code"], "approval_ended", again.text)
                    self.assertIn(f"was already {first}", again.json()["error"]["message"])
                with http(BOB) as other:
                    after = other.post(f"/v1/agent-team/approvals/{pending[0]['approvalID']}/deny", json={})
                    self.assertEqual(after.status_code, 404, after.text)
            # An id this server never had may be waiting in another server on the store.
            unknown = h.post("/v1/agent-team/approvals/appr_elsewhere/approve")
            self.assertEqual(unknown.status_code, 404, unknown.text)
            self.assertIn("decide it there", unknown.json()["error"]["message"])
            self.assertIn("Analysis of: audit approve", decisions[0])
            self.assertIn("The auditor spawn was refused: spawn denied (approval_denied): not needed", decisions[1])
            self.assertIn("spawn denied (approval_denied): denied by an operator", decisions[2])
            last = spawned.json()["turnID"]
            frames = feed_frames(
                h,
                f"/event?session_id={session.id}&after=0",
                until=lambda f: f["type"] == "turn.done" and f["properties"]["turnID"] == last,
            )
        requested = [f["properties"] for _, f in frames if f["type"] == "agent_team.spawn.requested"]
        self.assertEqual(len(requested), 4)
        self.assertTrue(all(p["source"] == "ui_action" for p in requested))
        # The instances those spawns started say where they came from too.
        started = [f["properties"] for _, f in frames if f["type"] == "agent_team.instance.started"]
        self.assertEqual(len(started), 2, started)
        self.assertEqual({p["source"] for p in started}, {"ui_action"}, started)
        denied = [f["properties"] for _, f in frames if f["type"] == "agent_team.spawn.denied"]
        self.assertEqual([d["code"] for d in denied], ["approval_denied", "approval_denied"])
        self.assertEqual([t.id for t in session.list_turns()][0], spawned.json()["turnID"])
        with http() as h:
            agent_session = alice.create_session(agent_name="demo")
            wrong = h.post("/v1/agent-team/spawn", json={"session_id": agent_session.id, "role": "analyst", "task": "x"})
            self.assertEqual(wrong.status_code, 400)
            ghost = h.post("/v1/agent-team/spawn", json={"session_id": session.id, "role": "ghost", "task": "x"})
            self.assertEqual(ghost.status_code, 400, ghost.text)
            self.assertEqual(ghost.json()["error"]["param"], "role")
            self.assertIn("analyst", ghost.json()["error"]["message"])
            # What the policy says of every spawn of a role is said at once, not as a
            # denial after a turn: the analyst needs a justification.
            unjustified = h.post("/v1/agent-team/spawn", json={"session_id": session.id, "role": "analyst", "task": "x", "justification": " "})
            self.assertEqual(unjustified.status_code, 400, unjustified.text)
            self.assertEqual(unjustified.json()["error"]["param"], "justification")
            # A team session waiting for an approval takes no spawn until it is answered: said
            # as that, not as a refused user.message the spawn never sent.
            waiting = alice.create_session(agent_name="demo-team")
            run(waiting, message("email the plan"))
            paused = h.post("/v1/agent-team/spawn", json={"session_id": waiting.id, "role": "analyst", "task": "x", "justification": "ops"})
            self.assertEqual(paused.status_code, 409, paused.text)
            self.assertEqual(paused.json()["error"]["code"], "session_paused", paused.text)
            self.assertIn("before spawning into it", paused.json()["error"]["message"])


def kind(event):
    return event.type.value if hasattr(event.type, "value") else event.type


def agui_calling(call, name):
    """The assistant message, as an AG-UI client keeps it, that made the tool call `call`."""
    return {"id": "a1", "role": "assistant", "toolCalls": [
        {"id": call, "type": "function", "function": {"name": name, "arguments": "{}"}}]}


def agui_run(h, body):
    """Runs an AG-UI request; returns the parsed events."""
    adapter = pydantic.TypeAdapter(AgUiEvent)
    with h.stream("POST", "/agui/demo", json=body) as response:
        assert response.status_code == 200, response.read()
        return [adapter.validate_json(line[5:].strip()) for line in response.iter_lines() if line.startswith("data:")]


class Cancel(unittest.TestCase):
    def test_an_instance_and_a_mission_are_cancelled_through_the_api(self):
        session = client().create_session(agent_name="demo-team")
        with http() as h:
            for scope in ("instance", "mission"):
                body = {"session_id": session.id, "role": "analyst", "task": f"slow {scope} work", "justification": "ops"}
                spawned = h.post("/v1/agent-team/spawn", json=body).json()
                turn, mission = spawned["turnID"], spawned["missionID"]
                # Wait on the session feed for the instance to start.
                frames = feed_frames(
                    h,
                    f"/event?session_id={session.id}&after=0",
                    until=lambda f: f["type"] == "agent_team.instance.started" and f["properties"]["missionID"] == mission,
                )
                instance = frames[-1][1]["properties"]["instanceID"]
                running = h.get("/v1/agent-team/instances", params={"status": "running", "mission_id": mission}).json()
                self.assertEqual([i["instanceID"] for i in running["data"]], [instance])
                with http(BOB) as other:
                    self.assertEqual(other.post(f"/v1/agent-team/instances/{instance}/cancel").status_code, 404)
                    self.assertEqual(other.post(f"/v1/agent-team/missions/{mission}/cancel").status_code, 404)
                if scope == "instance":
                    cancelled = h.post(f"/v1/agent-team/instances/{instance}/cancel")
                    self.assertEqual(cancelled.status_code, 200, cancelled.text)
                else:
                    cancelled = h.post(f"/v1/agent-team/missions/{mission}/cancel")
                    self.assertEqual(cancelled.json()["cancelledInstances"], 1)
                events = [item.event for item in session.get_turn(turn).stream(after_sequence_number=0)]
                self.assertIsInstance(events[-1], TurnDoneEvent)
                done = [e for e in events if isinstance(e, ThreadDoneEvent)]
                self.assertEqual(len(done), 1)
                frames = feed_frames(
                    h,
                    f"/event?session_id={session.id}&after=0",
                    until=lambda f: f["type"] == "agent_team.instance.cancelled" and f["properties"]["instanceID"] == instance,
                )
                self.assertEqual(frames[-1][1]["properties"]["instanceID"], instance)
                self.assertEqual(h.post(f"/v1/agent-team/instances/{instance}/cancel").status_code, 404, "it has ended")

    def test_cancelling_a_mission_ends_its_turn_and_withdraws_its_pending_approval(self):
        session = client().create_session(agent_name="demo-team")
        with http() as h:
            body = {"session_id": session.id, "role": "auditor", "task": "audit the books"}
            spawned = h.post("/v1/agent-team/spawn", json=body).json()
            pending = h.get("/v1/agent-team/approvals", params={"wait_secs": 30}).json()["data"]
            ours = [p["approvalID"] for p in pending if p["missionID"] == spawned["missionID"]]
            self.assertEqual(len(ours), 1, pending)
            cancelled = h.post(f"/v1/agent-team/missions/{spawned['missionID']}/cancel")
            self.assertEqual(cancelled.status_code, 200, cancelled.text)
            self.assertEqual(session.get_turn(spawned["turnID"]).state.status, "cancelled")
            # Once it has ended there is nothing left to cancel.
            again = h.post(f"/v1/agent-team/missions/{spawned['missionID']}/cancel")
            self.assertEqual(again.status_code, 404, again.text)
            self.assertIn("running mission", again.json()["error"]["message"])
            left = [p["approvalID"] for p in h.get("/v1/agent-team/approvals").json()["data"]]
            self.assertNotIn(ours[0], left)
            withdrawn = h.post(f"/v1/agent-team/approvals/{ours[0]}/approve")
            self.assertEqual(withdrawn.status_code, 409, withdrawn.text)
            self.assertIn("was withdrawn", withdrawn.json()["error"]["message"])
        # The session takes new turns at once.
        events, _ = run(session, message("hello team"))
        self.assertIsInstance(events[-1], TurnDoneEvent)
        self.assertEqual(events[-1].state.status, "done")
        # A turn of an agent session is no mission.
        agent = client().create_session(agent_name="demo")
        run(agent, message("hi"))
        turn = next(iter(agent.list_turns())).id
        with http() as h:
            self.assertEqual(h.post(f"/v1/agent-team/missions/mis_{turn}/cancel").status_code, 404)


class AgUi(unittest.TestCase):
    def test_agui_run_streams_protocol_events(self):
        adapter = pydantic.TypeAdapter(AgUiEvent)
        body = {
            "threadId": "thread-agui-1",
            "runId": "run-1",
            "messages": [{"id": "m1", "role": "user", "content": "hi from ag-ui"}],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
        }
        with http() as h:
            with h.stream("POST", "/agui/demo", json=body) as response:
                self.assertEqual(response.status_code, 200)
                data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
        events = [adapter.validate_json(d) for d in data]
        kinds = [e.type.value if hasattr(e.type, "value") else e.type for e in events]
        self.assertEqual(kinds[0], "RUN_STARTED")
        self.assertEqual(kinds[-1], "RUN_FINISHED")
        self.assertEqual(events[0].thread_id, "thread-agui-1")
        self.assertEqual(events[0].run_id, "run-1")
        text = "".join(e.delta for e in events if (e.type.value if hasattr(e.type, "value") else e.type) == "TEXT_MESSAGE_CONTENT")
        self.assertEqual(text, "Echo: hi from ag-ui")

    def test_agui_resumes_answer_only_with_payloads_that_match_the_interrupt(self):
        def ask(h, thread, text):
            asked = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [
                {"id": "m1", "role": "user", "content": text}]})
            return asked[-1].outcome.interrupts[0].id

        def resume(h, thread, entry):
            return h.post("/agui/demo", json={"threadId": thread, "runId": "r2", "messages": [], "resume": [entry]})

        def answered(h, thread, entry):
            events = agui_run(h, {"threadId": thread, "runId": "r3", "messages": [], "resume": [entry]})
            return "".join(e.delta for e in events if kind(e) == "TEXT_MESSAGE_CONTENT")

        with http() as h:
            approval = ask(h, "agui-strict-approval", "email the team")
            refused = [
                {"status": "resolved", "payload": False},
                {"status": "resolved", "payload": "no"},
                {"status": "resolved", "payload": None},
                {"status": "resolved", "payload": {}},
                {"status": "resolved", "payload": {"approved": "false"}},
                {"status": "resolved", "payload": {"approved": 0}},
                {"status": "resolved"},
                {"status": "maybe", "payload": {"approved": True}},
            ]
            for entry in refused:
                response = resume(h, "agui-strict-approval", {"interruptId": approval, **entry})
                self.assertEqual(response.status_code, 400, (entry, response.text))
                self.assertEqual(response.json()["error"]["param"], "resume")
            # Nothing was decided: the interrupt is still there to answer.
            denied = {"interruptId": approval, "status": "resolved", "payload": {"approved": False, "reason": "not today"}}
            self.assertEqual(answered(h, "agui-strict-approval", denied), "Email not sent: not today.")

            approval = ask(h, "agui-strict-approve", "email the team")
            allowed = {"interruptId": approval, "status": "resolved", "payload": {"approved": True}}
            self.assertEqual(answered(h, "agui-strict-approve", allowed), "Email sent.")

            question = ask(h, "agui-strict-question", "ask me")
            for entry in ({"status": "resolved"}, {"status": "answered", "payload": "red"}):
                response = resume(h, "agui-strict-question", {"interruptId": question, **entry})
                self.assertEqual(response.status_code, 400, (entry, response.text))
            content = {"interruptId": question, "status": "resolved", "payload": {"content": "green"}}
            self.assertEqual(answered(h, "agui-strict-question", content), "You chose green.")

    def test_agui_runs_answer_only_what_the_client_added_after_the_last_assistant_message(self):
        tag = os.urandom(4).hex()
        text = lambda events: "".join(e.delta for e in events if kind(e) == "TEXT_MESSAGE_CONTENT")
        alice = client()

        def turns(thread):
            session = next(s for s in alice.list_sessions(agent_name="demo", limit=100) if s.title == thread)
            return list(alice.get_session(session.id).list_turns())

        with http() as h:
            # A run sent again with nothing new (a retry, a re-render) is refused, not
            # answered a second time.
            thread = f"again-{tag}"
            hello = {"id": "u1", "role": "user", "content": "hello there"}
            first = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [hello]})
            # The same run sent again (a retry after a dropped connection) is streamed again
            # from its turn, not run twice.
            retried = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [hello]})
            self.assertEqual(text(retried), text(first))
            self.assertEqual(kind(retried[-1]), "RUN_FINISHED")
            self.assertEqual(len(turns(thread)), 1)
            reply = {"id": "a1", "role": "assistant", "content": text(first)}
            again = h.post("/agui/demo", json={"threadId": thread, "runId": "r2", "messages": [hello, reply]})
            self.assertEqual(again.status_code, 400, again.text)
            self.assertEqual(again.json()["error"]["param"], "messages")
            self.assertIn("nothing new to answer", again.json()["error"]["message"])
            self.assertEqual(len(turns(thread)), 1)
            # A run needs an id to tell a retry from a new run.
            for run_id in ("", "  "):
                blank = h.post("/agui/demo", json={"threadId": thread, "runId": run_id, "messages": [hello]})
                self.assertEqual(blank.status_code, 400, blank.text)
                self.assertEqual(blank.json()["error"]["param"], "runId")
            # Once the thread has gone on, an earlier run sent again (a late retry) is not
            # run a second time: it would repeat what it did.
            follow = {"id": "u2", "role": "user", "content": "and again"}
            agui_run(h, {"threadId": thread, "runId": "r3", "messages": [hello, reply, follow]})
            late = h.post("/agui/demo", json={"threadId": thread, "runId": "r1", "messages": [hello]})
            self.assertEqual(late.status_code, 409, late.text)
            self.assertEqual(late.json()["error"]["code"], "run_superseded")
            self.assertEqual(len(turns(thread)), 2)
            # Copies of a new run sent at once (a client retrying on other connections)
            # run it once: each copy streams that one turn.
            once = {"threadId": thread, "runId": "r4", "messages": [{"id": "u3", "role": "user", "content": "once"}]}

            def send_copy(_):
                with http() as other:
                    return text(agui_run(other, once))

            with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
                copies = list(pool.map(send_copy, range(6)))
            self.assertEqual(len(set(copies)), 1, copies)
            self.assertEqual(len(turns(thread)), 3)
            # However many runs later, an earlier run is still recognised.
            for index in range(40):
                agui_run(h, {"threadId": thread, "runId": f"n{index}", "messages": [{"id": f"n{index}", "role": "user", "content": "next"}]})
            for run_id, content in (("r4", "once"), ("r1", "hello there")):
                late = h.post("/agui/demo", json={"threadId": thread, "runId": run_id, "messages": [{"id": "x", "role": "user", "content": content}]})
                self.assertEqual(late.status_code, 409, late.text)
                self.assertEqual(late.json()["error"]["code"], "run_superseded")
            self.assertEqual(len(turns(thread)), 43)

            # A client tool answered the AG-UI way, with a tool message for its call.
            thread = f"tool-message-{tag}"
            ask = {"id": "u1", "role": "user", "content": "ask me"}
            asked = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [ask]})
            call = asked[-1].outcome.interrupts[0].id
            calling = agui_calling(call, "ask_user_question")
            # A result the client was sent earlier (of a tool the server ran) is no answer.
            earlier = {"id": "t0", "role": "tool", "toolCallId": "call_ran_on_the_server", "content": "42"}
            answer = {"id": "t1", "role": "tool", "toolCallId": call, "content": "Blue"}
            answered = agui_run(h, {"threadId": thread, "runId": "r2", "messages": [ask, calling, earlier, answer]})
            self.assertEqual(text(answered), "You chose Blue.")
            # The client has its own tool message for the answer: no second one is sent.
            self.assertEqual([e for e in answered if kind(e) == "TOOL_CALL_RESULT"], [])

            # An approval answered with a tool message: its content is the payload `resume`
            # takes; one that is not is refused naming `messages`, deciding nothing.
            thread = f"tool-message-approval-{tag}"
            email = {"id": "u1", "role": "user", "content": "email the team"}
            asked = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [email]})
            approval = asked[-1].outcome.interrupts[0].id
            calling = agui_calling(approval, "send_email")
            unclear = {"id": "t1", "role": "tool", "toolCallId": approval, "content": "sure"}
            refused = h.post("/agui/demo", json={"threadId": thread, "runId": "r2", "messages": [email, calling, unclear]})
            self.assertEqual(refused.status_code, 400, refused.text)
            self.assertEqual(refused.json()["error"]["param"], "messages", refused.text)
            self.assertIn(f"the tool message answering {approval}", refused.json()["error"]["message"])
            allow = {"id": "t1", "role": "tool", "toolCallId": approval, "content": json.dumps({"approved": True})}
            allowed = agui_run(h, {"threadId": thread, "runId": "r3", "messages": [email, calling, allow]})
            self.assertEqual(text(allowed), "Email sent.")

            # A new user message sent with the answers is refused, not dropped; nothing is
            # decided, and the interrupt is still there to answer.
            thread = f"resume-and-message-{tag}"
            email = {"id": "u1", "role": "user", "content": "email the team"}
            asked = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [email]})
            approval = asked[-1].outcome.interrupts[0].id
            deny = {"interruptId": approval, "status": "cancelled"}
            other = {"id": "u2", "role": "user", "content": "never mind, calculate 1 + 1"}
            both = h.post("/agui/demo", json={"threadId": thread, "runId": "r2", "messages": [email, other], "resume": [deny]})
            self.assertEqual(both.status_code, 400, both.text)
            self.assertEqual(both.json()["error"]["param"], "resume")
            self.assertIn("a new user message cannot be sent with `resume`", both.json()["error"]["message"])
            self.assertEqual(len(turns(thread)), 1)
            # The first message sent again with the answer is no new message.
            denied = agui_run(h, {"threadId": thread, "runId": "r3", "messages": [email], "resume": [deny]})
            self.assertEqual(text(denied), "Email not sent: cancelled.")
            followed = agui_run(h, {"threadId": thread, "runId": "r4", "messages": [email, other]})
            self.assertTrue(text(followed).endswith("The result is 2."), text(followed))

    def test_agui_frontend_tools_are_offered_and_their_calls_left_to_the_client(self):
        thread = f"frontend-{os.urandom(4).hex()}"
        tools = [{"name": "get_weather", "description": "The weather here.",
                  "parameters": {"type": "object", "properties": {}}}]
        use = {"id": "u1", "role": "user", "content": "use get_weather"}
        with http() as h:
            first = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [use], "tools": tools})
            finished = first[-1]
            self.assertEqual(kind(finished), "RUN_FINISHED")
            # A completed run leaving the frontend tool's call to the client, not an interrupt.
            self.assertEqual(finished.outcome.type, "success")
            calls = [e for e in first if kind(e) == "TOOL_CALL_START"]
            self.assertEqual([c.tool_call_name for c in calls], ["get_weather"])
            self.assertEqual(finished.outcome.pending_tool_call_ids, [calls[0].tool_call_id])
            call = calls[0].tool_call_id
            calling = agui_calling(call, "get_weather")
            result = {"id": "t1", "role": "tool", "toolCallId": call, "content": "sunny"}
            second = agui_run(h, {"threadId": thread, "runId": "r2", "messages": [use, calling, result], "tools": tools})
            text = "".join(e.delta for e in second if kind(e) == "TEXT_MESSAGE_CONTENT")
            self.assertEqual(text, "Done: sunny")
            # The client's own result is not sent back to it, also when it retries the run.
            retried = agui_run(h, {"threadId": thread, "runId": "r2", "messages": [use, calling, result], "tools": tools})
            for run in (second, retried):
                echoed = [e for e in run if kind(e) == "TOOL_CALL_RESULT" and e.tool_call_id == call]
                self.assertEqual(echoed, [], "the client holds its result already")
            self.assertEqual("".join(e.delta for e in retried if kind(e) == "TEXT_MESSAGE_CONTENT"), "Done: sunny")
            # A call left unanswered blocks the next message, and the error says how to go on.
            left = agui_run(h, {"threadId": thread + "-left", "runId": "r1", "messages": [use], "tools": tools})
            pending = left[-1].outcome.pending_tool_call_ids
            ignored = h.post("/agui/demo", json={"threadId": thread + "-left", "runId": "r2", "messages": [
                use, {"id": "u2", "role": "user", "content": "never mind"}], "tools": tools})
            self.assertEqual(ignored.status_code, 400, ignored.text)
            self.assertIn("send a tool message for each pending toolCallId", ignored.json()["error"]["message"])
            cancelled = [{"interruptId": pending[0], "status": "cancelled"}]
            gone = agui_run(h, {"threadId": thread + "-left", "runId": "r3", "messages": [use], "resume": cancelled, "tools": tools})
            self.assertEqual(kind(gone[-1]), "RUN_FINISHED")
            # A frontend tool may not take the name of one of the agent's.
            clash = [{"name": "calculator", "parameters": {"type": "object"}}]
            refused = h.post("/agui/demo", json={"threadId": thread, "runId": "r3", "messages": [
                use, calling, result, {"id": "a2", "role": "assistant", "content": text},
                {"id": "u2", "role": "user", "content": "hi"}], "tools": clash})
            self.assertEqual(refused.status_code, 400, refused.text)
            self.assertEqual(refused.json()["error"]["param"], "tools")

    def test_agui_context_is_shown_to_the_model_for_its_run_alone(self):
        thread = f"context-{os.urandom(4).hex()}"
        ask = {"id": "u1", "role": "user", "content": "What do you see?"}
        context = [{"description": "The page open", "value": "Invoices, page 2"},
                   {"description": "Selected rows", "value": "3"}]
        with http() as h:
            first = agui_run(h, {"threadId": thread, "runId": "r1", "messages": [ask], "context": context})
            text = "".join(e.delta for e in first if kind(e) == "TEXT_MESSAGE_CONTENT")
            self.assertEqual(text, "I see The page open: Invoices, page 2; Selected rows: 3.")
            # The next run gives none: the model sees none.
            answered = {"id": "a1", "role": "assistant", "content": text}
            again = {"id": "u2", "role": "user", "content": "What do you see now?"}
            second = agui_run(h, {"threadId": thread, "runId": "r2", "messages": [ask, answered, again], "context": []})
            text = "".join(e.delta for e in second if kind(e) == "TEXT_MESSAGE_CONTENT")
            self.assertEqual(text, "I see no context from your application.")
            # Context without a description, or of the wrong shape, is refused naming it.
            for bad in ([{"description": " ", "value": "x"}], [{"description": "d"}], {"page": 2}):
                refused = h.post("/agui/demo", json={"threadId": thread, "runId": "r3", "messages": [
                    ask, answered, again, {"id": "a2", "role": "assistant", "content": text},
                    {"id": "u3", "role": "user", "content": "hi"}], "context": bad})
                self.assertEqual(refused.status_code, 400, refused.text)
                self.assertEqual(refused.json()["error"].get("param", "").split(".")[0].split("[")[0], "context", refused.text)

    def test_an_agui_client_that_goes_away_cancels_its_run_and_the_thread_goes_on(self):
        # AG-UI's abortRun closes the connection: the turn must not run on for no one,
        # holding the thread's session (the next run would be refused as turn_running).
        thread = f"abandoned-{os.urandom(4).hex()}"
        body = {"threadId": thread, "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "slow"}]}
        with http() as h:
            with h.stream("POST", "/agui/demo", json=body) as response:
                self.assertEqual(response.status_code, 200)
                for line in response.iter_lines():
                    if '"TEXT_MESSAGE_CONTENT"' in line:
                        break
        alice = client()
        session = next(s for s in alice.list_sessions(agent_name="demo", limit=100) if s.title == thread)
        turn = next(iter(alice.get_session(session.id).list_turns()))
        events = [item.event for item in alice.get_session(session.id).get_turn(turn.id).stream(after_sequence_number=0)]
        self.assertIsInstance(events[-1], TurnDoneEvent)
        self.assertEqual(events[-1].state.status, "cancelled")
        with http() as h:
            again = [{"id": "m1", "role": "user", "content": "slow"}, {"id": "m2", "role": "user", "content": "hello again"}]
            answered = agui_run(h, {"threadId": thread, "runId": "r2", "messages": again})
        self.assertEqual(kind(answered[-1]), "RUN_FINISHED")
        text = "".join(e.delta for e in answered if kind(e) == "TEXT_MESSAGE_CONTENT")
        self.assertEqual(text, "Echo: hello again")

    def test_an_agui_run_retried_after_a_dropped_connection_goes_on(self):
        # A connection that drops is retried under the same runId: the run is not taken
        # for aborted, and the retry streams it to its end.
        thread = f"retried-{os.urandom(4).hex()}"
        body = {"threadId": thread, "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "slow"}]}
        with http() as h:
            with h.stream("POST", "/agui/demo", json=body) as response:
                self.assertEqual(response.status_code, 200)
                for line in response.iter_lines():
                    if '"TEXT_MESSAGE_CONTENT"' in line:
                        break
            retried = agui_run(h, body)
        self.assertEqual(kind(retried[0]), "RUN_STARTED")
        self.assertEqual(kind(retried[-1]), "RUN_FINISHED")
        alice = client()
        session = next(s for s in alice.list_sessions(agent_name="demo", limit=100) if s.title == thread)
        turn = next(iter(alice.get_session(session.id).list_turns()))
        self.assertEqual(turn.state.status, "done", turn.state)

    def test_an_agui_run_without_a_user_message_is_refused_naming_messages(self):
        with http() as h:
            for messages in ([], [{"id": "s", "role": "system", "content": "be brief"}], [{"id": "u", "role": "user", "content": ""}]):
                body = {"threadId": "agui-no-message", "runId": "r1", "messages": messages}
                response = h.post("/agui/demo", json=body)
                self.assertEqual(response.status_code, 400, response.text)
                self.assertEqual(response.json()["error"]["param"], "messages")

    def test_refused_agui_runs_leave_nothing_and_a_title_is_not_a_thread(self):
        alice = client()
        tag = os.urandom(4).hex()

        def titled(title):
            return [s.id for s in alice.list_sessions(agent_name="demo", limit=100) if s.title == title]

        with http() as h:
            bad = {"threadId": f"int-{tag}", "runId": "r", "messages": [{"id": "m", "role": "user", "content": 5}]}
            self.assertEqual(h.post("/agui/demo", json=bad).status_code, 400)
            answer = {"interruptId": "call_1_0", "status": "resolved", "payload": {"approved": True}}
            never = h.post("/agui/demo", json={"threadId": f"never-{tag}", "runId": "r", "messages": [], "resume": [answer]})
            self.assertEqual(never.status_code, 400, never.text)
            self.assertEqual(never.json()["error"]["param"], "resume")
            hi = [{"id": "m", "role": "user", "content": "hi"}]
            empty = h.post("/agui/demo", json={"threadId": " ", "runId": "r", "messages": hi})
            self.assertEqual(empty.status_code, 400, empty.text)
            self.assertEqual(empty.json()["error"]["param"], "threadId")
        for title in (f"int-{tag}", f"never-{tag}", " "):
            self.assertEqual(titled(title), [], f"a refused run left a session titled {title!r}")
        # A session made through the sessions API with a thread's title is not that thread,
        # even while it waits for an approval.
        with http() as h:
            made = h.post("/v1/agents/sessions", json={"agent_name": "demo", "title": f"support-{tag}"})
            self.assertEqual(made.status_code, 200, made.text)
        made = made.json()
        run(alice.get_session(made["data"]["id"]), message("email the team"))
        with http() as h:
            fresh = [{"id": "m", "role": "user", "content": "hello from a new thread"}]
            events = agui_run(h, {"threadId": f"support-{tag}", "runId": "r", "messages": fresh})
        text = "".join(e.delta for e in events if kind(e) == "TEXT_MESSAGE_CONTENT")
        self.assertEqual(text, "Echo: hello from a new thread")
        self.assertEqual(len(titled(f"support-{tag}")), 2)


if __name__ == "__main__":
    unittest.main()
