"""Wire compatibility of Agentry's rendered events with the published client libraries.

Agentry renders a fixture file (path in the AGENTRY_FIXTURES environment variable)
containing the exact JSON and SSE text it puts on the wire. These tests feed that
text to the real client code a user would run:

* ``truefoundry-gateway-sdk``: the model unions, the ``parse_obj_as`` /
  ``parse_sse_obj`` helpers and the ``EventSource`` SSE parser its raw client uses,
  and ``merge_event_delta`` from its agents helpers;
* ``ag-ui-protocol``: the discriminated ``Event`` union.

Both libraries accept unknown fields silently (``extra="allow"``) and map unknown
enum values onto a forward-compatibility member, so parsing alone would not catch a
misspelled field. Every parsed tree is therefore walked for extra fields and unknown
enum members, and re-serialised to check that nothing was coerced, dropped or added.

Which members must be covered is read from the SDK unions themselves
(``typing.get_args``), so a member added to the SDK fails these tests until the
fixtures render it too.
"""

import enum
import json
import os
import typing
import unittest

import httpx
import pydantic
from ag_ui.core import Event as AgUiEvent
from truefoundry_gateway_sdk import types as sdk_types
from truefoundry_gateway_sdk.agents import merge_event_delta
from truefoundry_gateway_sdk.core.http_sse import EventSource
from truefoundry_gateway_sdk.core.pydantic_utilities import parse_obj_as, parse_sse_obj
from truefoundry_gateway_sdk.types import (
    ListEventsResponse,
    ListSessionEventsResponse,
    ModelMessageDeltaEvent,
    ModelMessageEvent,
    SessionEvent,
    Turn,
    TurnEvent,
    TurnState,
    TurnStreamingEvent,
)

# The class each streaming ``type`` string must parse into.
KIND_TO_CLASS = {
    kind: getattr(sdk_types, name)
    for kind, name in {
        "turn.created": "TurnCreatedEvent",
        "turn.done": "TurnDoneEvent",
        "model.message": "ModelMessageEvent",
        "model.message.delta": "ModelMessageDeltaEvent",
        "tool.response": "ToolResponseEvent",
        "thread.created": "ThreadCreatedEvent",
        "thread.done": "ThreadDoneEvent",
        "mcp.auth_required": "McpAuthRequiredEvent",
        "mcp.initialize": "McpInitializeEvent",
        "sandbox.created": "SandboxCreatedEvent",
        "tool.approval_required": "ToolApprovalRequiredEvent",
        "tool.response_required": "ToolResponseRequiredEvent",
    }.items()
}

AGUI_EVENT = pydantic.TypeAdapter(AgUiEvent)

# AG-UI start/content/end families: (label, id key, start type, middle types, end type).
AGUI_SPANS = (
    ("text message", "messageId", "TEXT_MESSAGE_START", {"TEXT_MESSAGE_CONTENT"}, "TEXT_MESSAGE_END"),
    ("tool call", "toolCallId", "TOOL_CALL_START", {"TOOL_CALL_ARGS"}, "TOOL_CALL_END"),
    (
        "reasoning message",
        "messageId",
        "REASONING_MESSAGE_START",
        {"REASONING_MESSAGE_CONTENT"},
        "REASONING_MESSAGE_END",
    ),
    ("reasoning span", "messageId", "REASONING_START", set(), "REASONING_END"),
)
AGUI_TERMINALS = ("RUN_FINISHED", "RUN_ERROR")

_fixtures_cache = None


def load_fixtures():
    global _fixtures_cache
    if _fixtures_cache is None:
        path = os.environ.get("AGENTRY_FIXTURES")
        if not path:
            raise AssertionError(
                "AGENTRY_FIXTURES is not set: point it at the JSON fixture file rendered by Agentry"
            )
        if not os.path.isfile(path):
            raise AssertionError(f"AGENTRY_FIXTURES={path!r}: no such file")
        with open(path, encoding="utf-8") as handle:
            _fixtures_cache = json.load(handle)
    return _fixtures_cache


def union_members(union):
    """The classes of a ``typing.Union`` (unwrapping ``Annotated``), in declaration order."""
    if typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    return typing.get_args(union)


def kind_of(model_class):
    """The ``type`` literal a model class is discriminated by."""
    (kind,) = typing.get_args(model_class.model_fields["type"].annotation)
    return kind


def unknowns(value, path="$"):
    """Paths in a parsed tree that carry unknown fields or unknown enum values."""
    if isinstance(value, pydantic.BaseModel):
        extra = value.__pydantic_extra__ or {}
        if extra:
            yield f"{path} ({type(value).__name__}): unknown field(s) {sorted(extra)}"
        for name in type(value).model_fields:
            yield from unknowns(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, enum.Enum):
        # The SDK enums map any unrecognised value onto a `_UNKNOWN` member.
        if value.name == "_UNKNOWN":
            yield f"{path}: {value.value!r} is not a known {type(value).__name__} value"
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from unknowns(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from unknowns(item, f"{path}.{key}")


def describe(error):
    """A validation error, one line per problem, without pydantic's documentation links."""
    lines = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or "$"
        shown = repr(problem.get("input"))
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"  {where}: {problem['msg']} (got {shown})")
    return "\n".join(lines)


def without_none(value):
    """Drops None-valued keys recursively: an explicit null and an absent key mean the same."""
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def decode_sse(payload, chunk_size=None):
    """Runs bytes through the SDK's EventSource as its raw client does (empty data is skipped)."""
    content = payload
    if chunk_size is not None:
        content = [payload[at : at + chunk_size] for at in range(0, len(payload), chunk_size)]
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)
    return [sse for sse in EventSource(response).iter_sse() if sse.data]


class WireTestCase(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.fixtures = load_fixtures()

    def section(self, *keys):
        node = self.fixtures
        for depth, key in enumerate(keys):
            where = ".".join(keys[:depth]) or "the fixture file"
            self.assertIsInstance(node, dict, f"{where} is not an object")
            self.assertIn(key, node, f"{where} has no {key!r}")
            node = node[key]
        return node

    def non_empty_list(self, *keys):
        node = self.section(*keys)
        self.assertIsInstance(node, list, f"{'.'.join(keys)} is not a list")
        self.assertTrue(node, f"{'.'.join(keys)} is empty, so nothing would be checked")
        return node

    # Each helper fails outside its except block so the report is not doubled by exception chaining.
    def parse(self, type_, raw, what):
        try:
            return parse_obj_as(type_, raw)
        except pydantic.ValidationError as error:
            problem = describe(error)
        self.fail(f"{what} does not parse as {getattr(type_, '__name__', type_)}:\n{problem}")

    def frame_json(self, frame, what):
        try:
            return json.loads(frame.data)
        except ValueError as error:
            problem = str(error)
        self.fail(f"{what}: the SSE data is not JSON: {problem}")

    def parse_frame(self, frame, what):
        """Parses an SSE event's data the way the SDK's raw client does."""
        try:
            return parse_sse_obj(frame, TurnStreamingEvent)
        except pydantic.ValidationError as error:
            problem = describe(error)
        self.fail(f"{what}: the SDK cannot parse the SSE data:\n{problem}")

    def assert_no_unknowns(self, parsed, what):
        found = list(unknowns(parsed))
        if found:
            self.fail(f"{what} has content the SDK does not know:\n  " + "\n  ".join(found))

    def assert_round_trips(self, parsed, raw, what):
        # mode="json" runs the SDK's own serializer (UniversalBaseModel.dict), which also writes
        # every field with a non-None default; a discriminator we leave out (agent_info.type,
        # a tool call's type) therefore shows up here as a difference.
        dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
        self.assertEqual(dumped, raw, f"{what} re-serialises differently: a field was coerced, lost or defaulted")

    def assert_conforms(self, parsed, raw, what):
        self.assert_no_unknowns(parsed, what)
        self.assert_round_trips(parsed, raw, what)


class TrueFoundryHarnessWireTest(WireTestCase):
    def streaming(self):
        items = self.non_empty_list("harness", "streaming")
        for index, item in enumerate(items):
            for key in ("kind", "seq", "sse", "event"):
                self.assertIn(key, item, f"harness.streaming[{index}] has no {key!r}")
        return items

    def test_every_streaming_event_kind_parses_with_the_sdk(self):
        for index, item in enumerate(self.streaming()):
            kind, raw = item["kind"], item["event"]
            what = f"harness.streaming[{index}] ({kind})"
            with self.subTest(index=index, kind=kind):
                self.assertIn(kind, KIND_TO_CLASS, f"{what}: not a streaming event type")
                parsed = self.parse(TurnStreamingEvent, raw, what)
                self.assertEqual(parsed.type, kind, f"{what}: parsed type differs from kind")
                self.assertIs(type(parsed), KIND_TO_CLASS[kind], f"{what}: parsed into the wrong class")
                self.assert_conforms(parsed, raw, what)

    def test_streaming_events_cover_every_member_of_the_sdk_streaming_union(self):
        members = union_members(TurnStreamingEvent)
        self.assertEqual(
            set(KIND_TO_CLASS.values()), set(members), "this test's kind table is out of step with the SDK union"
        )
        covered = {
            type(self.parse(TurnStreamingEvent, item["event"], f"harness.streaming[{index}]"))
            for index, item in enumerate(self.streaming())
        }
        missing = sorted(kind_of(member) for member in members if member not in covered)
        self.assertEqual(missing, [], "harness.streaming renders no event of these SDK TurnStreamingEvent kinds")

    def test_every_sse_frame_decodes_with_the_sdk_event_source(self):
        for index, item in enumerate(self.streaming()):
            what = f"harness.streaming[{index}] ({item['kind']})"
            with self.subTest(index=index, kind=item["kind"]):
                seq = item["seq"]
                self.assertTrue(isinstance(seq, int) and not isinstance(seq, bool), f"{what}: seq is not an integer")
                frames = decode_sse(item["sse"].encode("utf-8"))
                self.assertEqual(len(frames), 1, f"{what}: the SSE text holds {len(frames)} data events, not 1")
                (frame,) = frames
                self.assertEqual(frame.id, str(seq), f"{what}: SSE id is not the event's seq")
                self.assertEqual(self.frame_json(frame, what), item["event"], f"{what}: SSE data is not the event")
                parsed = self.parse_frame(frame, what)
                self.assertIs(type(parsed), KIND_TO_CLASS.get(item["kind"]), f"{what}: SSE data parsed wrongly")

    def test_concatenated_sse_frames_decode_as_one_stream_in_order(self):
        items = self.streaming()
        stream = "".join(item["sse"] for item in items).encode("utf-8")
        # Small chunks, as a network delivers them: lines and UTF-8 sequences split across reads.
        frames = decode_sse(stream, chunk_size=7)
        self.assertEqual(len(frames), len(items), "the joined stream decodes to a different number of events")
        self.assertEqual(
            [(frame.id, self.frame_json(frame, "joined stream")) for frame in frames],
            [(str(item["seq"]), item["event"]) for item in items],
            "the joined stream decodes to different events or a different order",
        )
        for number, (frame, item) in enumerate(zip(frames, items)):
            what = f"joined stream event {number}"
            self.assertEqual(self.parse_frame(frame, what).type, item["kind"], f"{what}: wrong type")

    def test_stored_events_parse_as_the_sdk_list_events_response(self):
        raw = self.section("harness", "stored")
        parsed = self.parse(ListEventsResponse, raw, "harness.stored")
        self.assertTrue(parsed.data, "harness.stored.data is empty, so nothing would be checked")
        self.assert_conforms(parsed, raw, "harness.stored")

    def test_stored_events_cover_every_member_of_the_sdk_turn_event_union(self):
        parsed = self.parse(ListEventsResponse, self.section("harness", "stored"), "harness.stored")
        covered = {type(event) for event in parsed.data}
        missing = sorted(kind_of(member) for member in union_members(TurnEvent) if member not in covered)
        self.assertEqual(missing, [], "harness.stored holds no event of these SDK TurnEvent kinds")

    def test_session_events_parse_as_the_sdk_list_session_events_response(self):
        raw = self.section("harness", "session_events")
        parsed = self.parse(ListSessionEventsResponse, raw, "harness.session_events")
        self.assertTrue(parsed.data, "harness.session_events.data is empty, so nothing would be checked")
        self.assert_conforms(parsed, raw, "harness.session_events")

    def test_session_events_cover_every_member_of_the_sdk_session_event_union(self):
        raw = self.section("harness", "session_events")
        parsed = self.parse(ListSessionEventsResponse, raw, "harness.session_events")
        covered = {type(item.event) for item in parsed.data}
        missing = sorted(kind_of(member) for member in union_members(SessionEvent) if member not in covered)
        self.assertEqual(missing, [], "harness.session_events holds no event of these SDK SessionEvent kinds")

    def test_every_turn_parses_as_the_sdk_turn_model(self):
        for index, raw in enumerate(self.non_empty_list("harness", "turns")):
            what = f"harness.turns[{index}]"
            with self.subTest(index=index):
                self.assert_conforms(self.parse(Turn, raw, what), raw, what)

    def test_turns_cover_every_member_of_the_sdk_turn_state_union(self):
        turns = self.non_empty_list("harness", "turns")
        covered = {type(self.parse(Turn, raw, f"harness.turns[{index}]").state) for index, raw in enumerate(turns)}
        missing = sorted(member.__name__ for member in union_members(TurnState) if member not in covered)
        self.assertEqual(missing, [], "harness.turns has no turn in these SDK TurnState states")

    def test_sdk_merge_of_our_deltas_reproduces_our_merged_message(self):
        for index, case in enumerate(self.non_empty_list("harness", "merges")):
            what = f"harness.merges[{index}]"
            with self.subTest(index=index):
                self.assertTrue(case.get("deltas"), f"{what} has no deltas")
                self.assertIn("merged", case, f"{what} has no merged message")
                deltas = []
                for number, raw in enumerate(case["deltas"]):
                    delta = self.parse(ModelMessageDeltaEvent, raw, f"{what}.deltas[{number}]")
                    self.assert_conforms(delta, raw, f"{what}.deltas[{number}]")
                    deltas.append(delta)
                expected = self.parse(ModelMessageEvent, case["merged"], f"{what}.merged")
                self.assert_conforms(expected, case["merged"], f"{what}.merged")

                first = deltas[0]
                self.assertIsNotNone(first.created_at, f"{what}: the first delta has no created_at to build from")
                for number, delta in enumerate(deltas):
                    self.assertEqual(delta.thread_id, first.thread_id, f"{what}.deltas[{number}]: other thread")
                base = ModelMessageEvent(id=first.id, thread_id=first.thread_id, created_at=first.created_at)
                for number, delta in enumerate(deltas):
                    refusal = None
                    try:
                        merge_event_delta(base, delta)
                    except ValueError as error:
                        refusal = str(error)
                    if refusal is not None:
                        self.fail(f"{what}.deltas[{number}]: the SDK refuses to merge it: {refusal}")
                # The SDK's JSON serializer ignores exclude_none, hence without_none.
                self.assertEqual(
                    without_none(base.model_dump(mode="json", exclude_none=True)),
                    without_none(expected.model_dump(mode="json", exclude_none=True)),
                    f"{what}: the SDK's merge of the deltas differs from our merged message",
                )

    def test_sdk_merge_rejects_a_delta_with_a_different_id(self):
        case = self.non_empty_list("harness", "merges")[0]
        self.assertTrue(case.get("deltas"), "harness.merges[0] has no deltas")
        first = self.parse(ModelMessageDeltaEvent, case["deltas"][0], "harness.merges[0].deltas[0]")
        base = ModelMessageEvent(id=first.id, thread_id=first.thread_id, created_at=first.created_at or "")
        stranger = first.model_copy(update={"id": first.id + "-other"})
        with self.assertRaises(ValueError):
            merge_event_delta(base, stranger)


class AgUiWireTest(WireTestCase):
    def streams(self):
        raw = self.non_empty_list("agui")
        streams = raw if isinstance(raw[0], list) else [raw]
        for index, stream in enumerate(streams):
            self.assertIsInstance(stream, list, f"agui[{index}] is not a list of events")
            self.assertTrue(stream, f"agui stream {index} is empty")
            for number, event in enumerate(stream):
                self.assertIsInstance(event, dict, f"agui stream {index} event {number} is not an object")
        return streams

    def test_every_agui_event_parses_with_the_agui_event_union(self):
        for index, stream in enumerate(self.streams()):
            for number, raw in enumerate(stream):
                what = f"agui stream {index} event {number} ({raw.get('type')})"
                with self.subTest(stream=index, event=number):
                    parsed, problem = None, None
                    try:
                        parsed = AGUI_EVENT.validate_python(raw)
                    except pydantic.ValidationError as error:
                        problem = describe(error)
                    if problem is not None:
                        self.fail(f"{what} does not parse as an AG-UI Event:\n{problem}")
                    self.assert_no_unknowns(parsed, what)
                    self.assertEqual(
                        parsed.model_dump(mode="json", by_alias=True, exclude_none=True),
                        raw,
                        f"{what} re-serialises differently: a field was coerced, lost or defaulted",
                    )

    def test_every_agui_stream_is_well_formed(self):
        for index, stream in enumerate(self.streams()):
            with self.subTest(stream=index):
                self.assert_well_formed(stream, f"agui stream {index}")

    def assert_well_formed(self, events, label):
        types = [event.get("type") for event in events]
        self.assertEqual(types[0], "RUN_STARTED", f"{label} does not open with RUN_STARTED")
        self.assertEqual(types.count("RUN_STARTED"), 1, f"{label} has more than one RUN_STARTED")
        terminals = [number for number, kind in enumerate(types) if kind in AGUI_TERMINALS]
        self.assertEqual(
            terminals, [len(events) - 1], f"{label} must end with exactly one RUN_FINISHED or RUN_ERROR"
        )
        started, last = events[0], events[-1]
        if last["type"] == "RUN_FINISHED":
            for key in ("threadId", "runId"):
                self.assertEqual(last.get(key), started.get(key), f"{label}: RUN_FINISHED {key} differs")
            outcome = last.get("outcome") or {}
            if outcome.get("type") == "interrupt":
                self.assertTrue(outcome.get("interrupts"), f"{label}: interrupt outcome without interrupts")

        for family, key, start, middles, end in AGUI_SPANS:
            open_ids = {}
            for number, event in enumerate(events):
                kind = event.get("type")
                if kind not in middles and kind not in (start, end):
                    continue
                ident = event.get(key)
                where = f"{label} event {number} ({kind})"
                self.assertIsInstance(ident, str, f"{where} has no {key}")
                if kind == start:
                    self.assertNotIn(ident, open_ids, f"{where}: {family} {ident!r} is already in progress")
                    open_ids[ident] = number
                else:
                    self.assertIn(ident, open_ids, f"{where}: no open {start} for {family} {ident!r}")
                    if kind == end:
                        del open_ids[ident]
            self.assertEqual(open_ids, {}, f"{label}: {family}(s) started (id: event index) but never ended")


if __name__ == "__main__":
    unittest.main()
