//! Renderers: the agent-team examples of seed 001, and each vocabulary's rendering of the
//! sample turns.

use std::collections::{BTreeSet, HashMap};

use agentry_events::render::adalflow::{AdalFlowRenderer, AdalFlowStreamEvent, RunItem, RunItemName};
use agentry_events::render::agent_team::{self, AgentTeamContext};
use agentry_events::render::agno::{AgnoContext, AgnoEvent, AgnoRenderer};
use agentry_events::render::agui::{AguiEvent, AguiRenderer, RunFinishedOutcome};
use agentry_events::render::harness::{self, HarnessEvent};
use agentry_events::sample;
use agentry_events::{EventEnvelope, EventPayload};
use agentry_types::{BudgetLimit, BudgetUsage, RunStatus, ThreadId, Timestamp, TurnInputItem};
use serde_json::{Value, json};

fn context(session: Option<&str>, message: Option<&str>, instance: Option<&str>) -> AgentTeamContext {
    AgentTeamContext {
        session_id: session.map(str::to_owned),
        message_id: message.map(str::to_owned),
        mission_id: Some("m1".to_owned()),
        instance_id: instance.map(str::to_owned),
        ..AgentTeamContext::default()
    }
}

fn rendered(context: &AgentTeamContext, payload: &EventPayload, millis: i64) -> Value {
    let event = agent_team::render_payload(context, payload, Timestamp::from_unix_millis(millis)).unwrap();
    serde_json::to_value(event).unwrap()
}

#[test]
fn the_agent_team_renderer_reproduces_the_five_examples_of_the_specification() {
    let denied = rendered(
        &context(None, None, None),
        &EventPayload::SpawnDenied {
            requested_role: "worker".into(),
            code: "spawn_policy_missing".into(),
            error: "spawn policy file missing".into(),
        },
        1_739_850_000_000,
    );
    assert_eq!(
        denied,
        json!({"type": "agent_team.spawn.denied", "properties": {"missionID": "m1", "requestedRole": "worker",
            "code": "spawn_policy_missing", "error": "spawn policy file missing", "timestampMs": 1_739_850_000_000_i64}})
    );

    let started = rendered(
        &context(Some("ses_123"), None, Some("ins_123")),
        &EventPayload::InstanceStarted {
            role: "worker".into(),
            status: "running".into(),
            budget_limit: BudgetLimit { max_tokens: Some(8000), ..BudgetLimit::default() },
            skill_hash: Some("sha256:...".into()),
        },
        1_739_850_000_123,
    );
    assert_eq!(
        started,
        json!({"type": "agent_team.instance.started", "properties": {"sessionID": "ses_123", "missionID": "m1",
            "instanceID": "ins_123", "role": "worker", "status": "running", "budgetLimit": {"max_tokens": 8000},
            "skillHash": "sha256:...", "timestampMs": 1_739_850_000_123_i64}})
    );

    let exhausted = rendered(
        &context(Some("ses_123"), None, Some("ins_123")),
        &EventPayload::BudgetExhausted {
            exhausted_by: "max_tool_calls".into(),
            usage: BudgetUsage {
                tokens_used: 1200,
                steps_used: 3,
                tool_calls_used: 10,
                cost_used_usd: 0.42,
                elapsed_ms: Some(42000),
            },
        },
        1_739_850_002_222,
    );
    assert_eq!(
        exhausted,
        json!({"type": "agent_team.budget.exhausted", "properties": {"sessionID": "ses_123", "missionID": "m1",
            "instanceID": "ins_123", "exhaustedBy": "max_tool_calls", "tokensUsed": 1200, "stepsUsed": 3,
            "toolCallsUsed": 10, "costUsedUsd": 0.42, "elapsedMs": 42000, "timestampMs": 1_739_850_002_222_i64}})
    );

    let mission = rendered(
        &context(None, None, None),
        &EventPayload::MissionBudgetExhausted {
            exhausted_by: "mission_max_tokens".into(),
            usage: BudgetUsage {
                tokens_used: 40000,
                steps_used: 22,
                tool_calls_used: 61,
                cost_used_usd: 5.61,
                elapsed_ms: None,
            },
        },
        1_739_850_003_333,
    );
    assert_eq!(
        mission,
        json!({"type": "agent_team.mission.budget.exhausted", "properties": {"missionID": "m1",
            "exhaustedBy": "mission_max_tokens", "tokensUsed": 40000, "stepsUsed": 22, "toolCallsUsed": 61,
            "costUsedUsd": 5.61, "timestampMs": 1_739_850_003_333_i64}})
    );

    let denied_capability = rendered(
        &context(Some("ses_123"), Some("msg_123"), Some("ins_123")),
        &EventPayload::CapabilityDenied {
            tool: "websearch".into(),
            reason: "network disabled for this agent instance".into(),
        },
        1_739_850_003_333,
    );
    assert_eq!(
        denied_capability,
        json!({"type": "agent_team.capability.denied", "properties": {"sessionID": "ses_123", "messageID": "msg_123",
            "missionID": "m1", "instanceID": "ins_123", "tool": "websearch",
            "reason": "network disabled for this agent instance", "timestampMs": 1_739_850_003_333_i64}})
    );
}

#[test]
fn agent_team_events_of_a_turn_carry_its_session_run_and_team_context() {
    let events = sample::everything_turn().unwrap();
    let mut names = BTreeSet::new();
    for event in &events {
        let Some(rendered) = agent_team::render(event) else {
            assert!(!event.payload.is_agent_team(), "{} has no agent-team rendering", event.kind());
            continue;
        };
        let value = serde_json::to_value(&rendered).unwrap();
        names.insert(value["type"].as_str().unwrap().to_owned());
        let properties = &value["properties"];
        assert_eq!(properties["sessionID"], json!(event.session_id.to_string()));
        assert_eq!(properties["runID"], json!(event.turn_id.to_string()));
        assert_eq!(properties["missionID"], json!("m1"));
        let lifecycle =
            ["agent_team.spawn.requested", "agent_team.spawn.approved", "agent_team.instance.started"];
        let expected_source = if lifecycle.contains(&value["type"].as_str().unwrap()) {
            json!("tool_call")
        } else {
            Value::Null
        };
        assert_eq!(properties.get("source").cloned().unwrap_or(Value::Null), expected_source);
        assert_eq!(properties["timestampMs"], json!(event.created_at.unix_millis()));
    }
    assert!(names.contains("agent_team.spawn.requested") && names.contains("agent_team.capability.denied"));
}

#[test]
fn every_agent_team_event_name_of_the_specification_is_rendered() {
    let expected: BTreeSet<&str> = [
        "agent_team.spawn.requested",
        "agent_team.spawn.denied",
        "agent_team.spawn.approved",
        "agent_team.instance.started",
        "agent_team.budget.usage",
        "agent_team.budget.exhausted",
        "agent_team.instance.cancelled",
        "agent_team.instance.completed",
        "agent_team.instance.failed",
        "agent_team.mission.budget.exhausted",
        "agent_team.capability.denied",
    ]
    .into();
    let rendered: BTreeSet<String> = sample::all_turns()
        .unwrap()
        .iter()
        .flatten()
        .filter_map(agent_team::render)
        .map(|event| serde_json::to_value(event).unwrap()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rendered.iter().map(String::as_str).collect::<BTreeSet<_>>(), expected);
}

#[test]
fn the_harness_renders_all_twelve_streaming_kinds_with_their_sequence_as_the_sse_id() {
    let mut kinds = BTreeSet::new();
    for event in sample::all_turns().unwrap().iter().flatten() {
        if let Some(rendered) = harness::render(event) {
            kinds.insert(rendered.kind());
            let frame = harness::sse_frame(event.seq, &rendered);
            assert!(frame.starts_with(&format!("id: {}\ndata: {{", event.seq)));
            assert!(frame.ends_with("}\n\n"));
            let data: Value =
                serde_json::from_str(frame.lines().nth(1).unwrap().trim_start_matches("data: ")).unwrap();
            assert_eq!(data["type"], json!(rendered.kind()));
        }
    }
    assert_eq!(kinds.len(), 12, "kinds: {kinds:?}");
}

#[test]
fn harness_deltas_share_the_id_of_their_message_and_open_tool_calls_with_routing_metadata() {
    let events = sample::failed_turn().unwrap();
    let mut ids = BTreeSet::new();
    for event in &events {
        match harness::render(event) {
            Some(HarnessEvent::ModelMessageDelta(delta)) => {
                ids.insert(delta.id.clone());
                for chunk in delta.tool_calls.unwrap_or_default() {
                    let opens = chunk.function.as_ref().is_some_and(|f| f.name.is_some());
                    assert_eq!(opens, chunk.tool_info.is_some(), "tool_info comes with the first chunk only");
                }
            }
            Some(HarnessEvent::ModelMessage(message)) => assert!(ids.contains(&message.id)),
            _ => {}
        }
    }
    assert_eq!(ids.len(), 1);
}

fn agui(events: &[EventEnvelope]) -> Vec<AguiEvent> {
    let mut renderer = AguiRenderer::new();
    events.iter().flat_map(|event| renderer.render(event)).collect()
}

fn assert_well_formed(frames: &[AguiEvent]) {
    assert!(matches!(frames.first(), Some(AguiEvent::RunStarted { .. })));
    assert!(matches!(frames.last(), Some(AguiEvent::RunFinished { .. } | AguiEvent::RunError { .. })));
    let mut open: HashMap<String, usize> = HashMap::new();
    for frame in frames {
        let value = serde_json::to_value(frame).unwrap();
        let kind = value["type"].as_str().unwrap().to_owned();
        let key = value
            .get("messageId")
            .or_else(|| value.get("toolCallId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(key) = key {
            if kind.ends_with("_START") {
                *open.entry(format!("{}:{key}", kind.trim_end_matches("_START"))).or_default() += 1;
            } else if kind.ends_with("_END") {
                let slot = open.entry(format!("{}:{key}", kind.trim_end_matches("_END"))).or_default();
                assert_eq!(*slot, 1, "{kind} for {key} without an open START");
                *slot = 0;
            } else if kind.ends_with("_CONTENT") || kind.ends_with("_ARGS") {
                let prefix = kind.rsplit_once('_').unwrap().0;
                assert_eq!(
                    open.get(&format!("{prefix}:{key}")),
                    Some(&1),
                    "{kind} for {key} outside START/END"
                );
            }
        }
    }
    assert!(open.values().all(|count| *count == 0), "unclosed frames: {open:?}");
}

#[test]
fn ag_ui_wraps_deltas_in_start_and_end_frames_and_ends_with_an_interrupt_for_required_actions() {
    let frames = agui(&sample::everything_turn().unwrap());
    assert_well_formed(&frames);
    let Some(AguiEvent::RunFinished { outcome: RunFinishedOutcome::Interrupt { interrupts }, .. }) =
        frames.last()
    else {
        panic!("expected an interrupt outcome, got {:?}", frames.last());
    };
    let reasons: Vec<&str> = interrupts.iter().map(|i| i.reason.as_str()).collect();
    assert_eq!(reasons, ["tool_approval", "tool_response", "mcp_auth"]);
    assert_eq!(interrupts[0].tool_call_id.as_deref(), Some("call_email"));
    assert_eq!(interrupts[1].message.as_deref(), Some("Formal or casual?"));
    assert!(frames.iter().any(|f| matches!(f, AguiEvent::SubagentStarted { .. })));
    assert!(frames.iter().any(|f| matches!(f, AguiEvent::SubagentError { .. })));
    assert!(frames.iter().any(|f| matches!(f, AguiEvent::ReasoningMessageContent { .. })));
    assert!(frames.iter().any(|f| matches!(f, AguiEvent::ToolCallResult { .. })));
    // Sub-agent text is attributed to its thread.
    assert!(
        frames.iter().any(|f| matches!(f, AguiEvent::TextMessageContent { subagent_run_id: Some(_), .. }))
    );
}

#[test]
fn ag_ui_replays_a_stored_log_without_deltas_as_the_same_text() {
    let events = sample::answer_turn("Hi", "Hello there, friend").unwrap();
    let text = |frames: &[AguiEvent]| -> String {
        frames
            .iter()
            .filter_map(|f| match f {
                AguiEvent::TextMessageContent { delta, .. } => Some(delta.as_str()),
                _ => None,
            })
            .collect()
    };
    let live = agui(&events);
    let stored: Vec<EventEnvelope> = events.iter().filter(|e| e.is_durable()).cloned().collect();
    let replayed = agui(&stored);
    assert_well_formed(&live);
    assert_well_formed(&replayed);
    assert_eq!(text(&live), "Hello there, friend");
    assert_eq!(text(&replayed), "Hello there, friend");
    assert!(matches!(
        replayed.last(),
        Some(AguiEvent::RunFinished {
            outcome: RunFinishedOutcome::Success { pending_tool_call_ids: None },
            result: Some(_),
            ..
        })
    ));
}

#[test]
fn ag_ui_reports_answers_to_client_calls_as_results_and_attributes_sub_agent_custom_events() {
    let mut events = sample::answer_turn("Hi", "Hello there, friend").unwrap();
    let sub = ThreadId::new_sub_thread();
    let EventPayload::TurnCreated { input, .. } = &mut events[0].payload else { panic!("{:?}", events[0]) };
    *input = vec![
        TurnInputItem::respond(ThreadId::main(), "call_main", "Blue"),
        TurnInputItem::respond(sub.clone(), "call_sub", "Formal"),
        TurnInputItem::allow(ThreadId::main(), "call_gated"),
    ];
    let mut custom = events[1].clone();
    custom.thread_id = Some(sub.clone());
    custom.payload = EventPayload::MemoryUpdateStarted {};
    events.insert(1, custom);
    let frames = agui(&events);
    assert_well_formed(&frames);
    let results: Vec<(&str, &str, Option<&String>)> = frames
        .iter()
        .filter_map(|frame| match frame {
            AguiEvent::ToolCallResult { tool_call_id, content, subagent_run_id, .. } => {
                Some((tool_call_id.as_str(), content.as_str(), subagent_run_id.as_ref()))
            }
            _ => None,
        })
        .collect();
    // An approval is answered by the tool's own result, when it runs: not here.
    assert_eq!(results, [("call_main", "Blue", None), ("call_sub", "Formal", Some(&sub.to_string()))]);
    assert!(matches!(frames[1], AguiEvent::ToolCallResult { .. }), "right after RUN_STARTED");
    assert!(frames.iter().any(|frame| matches!(frame,
        AguiEvent::Custom { name, subagent_run_id: Some(thread), .. }
            if name == "memory.update.started" && *thread == sub.to_string())));
}

#[test]
fn ag_ui_closes_a_cut_off_message_and_reports_cancellation_and_errors() {
    let cancelled = agui(&sample::cancelled_turn().unwrap());
    assert_well_formed(&cancelled);
    assert!(matches!(
        cancelled.last(),
        Some(AguiEvent::RunFinished { outcome: RunFinishedOutcome::Cancelled {}, .. })
    ));
    let failed = agui(&sample::failed_turn().unwrap());
    assert_well_formed(&failed);
    assert!(
        matches!(failed.last(), Some(AguiEvent::RunError { message, .. }) if message.contains("HTTP 500"))
    );
}

#[test]
fn agno_renders_the_team_run_with_member_responses_and_unix_seconds() {
    let events = sample::everything_turn().unwrap();
    let mut renderer = AgnoRenderer::new(AgnoContext {
        team_id: "team_1".into(),
        team_name: "demo-team".into(),
        model: "scripted".into(),
        model_provider: "scripted".into(),
        ..AgnoContext::default()
    });
    let rendered: Vec<AgnoEvent> = events.iter().filter_map(|event| renderer.render(event)).collect();
    let names: BTreeSet<String> = rendered
        .iter()
        .map(|e| serde_json::to_value(e).unwrap()["event"].as_str().unwrap().to_owned())
        .collect();
    for name in [
        "TeamRunStarted",
        "TeamRunContent",
        "TeamRunIntermediateContent",
        "TeamRunCompleted",
        "TeamToolCallStarted",
        "TeamToolCallCompleted",
        "TeamReasoningStarted",
        "TeamReasoningStep",
        "TeamReasoningCompleted",
        "TeamMemoryUpdateStarted",
        "TeamMemoryUpdateCompleted",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    let Some(AgnoEvent::TeamRunCompleted { base, member_responses, status, metrics, .. }) = rendered.last()
    else {
        panic!("the last event is TeamRunCompleted");
    };
    assert_eq!(member_responses.len(), 2);
    assert_eq!(*status, RunStatus::Paused, "a run waiting on required actions is paused");
    assert!(metrics.is_some());
    assert_eq!(base.created_at, events.last().unwrap().created_at.unix_seconds());
    let value = serde_json::to_value(rendered.last().unwrap()).unwrap();
    assert_eq!(value["status"], json!("PAUSED"));
    assert_eq!(value["team_name"], json!("demo-team"));
    assert_eq!(value["member_responses"][0]["agent_name"], json!("researcher"));
    assert_eq!(value["member_responses"][1]["status"], json!("ERROR"));
    assert!(value.get("workflow_id").is_none(), "None fields are left out");

    let tool = rendered.iter().find_map(|e| match e {
        AgnoEvent::TeamToolCallCompleted { tool_name, tool_args, tool_result, .. } => {
            Some((tool_name, tool_args, tool_result))
        }
        _ => None,
    });
    let (name, args, result) = tool.unwrap();
    assert_eq!(name, "calculator");
    assert_eq!(args["expression"], json!("12 * (3 + 4)"));
    assert_eq!(result, &json!("84"));
}

#[test]
fn agno_reports_cancellation_and_errors() {
    let last = |events: Vec<EventEnvelope>| {
        let mut renderer = AgnoRenderer::new(AgnoContext::default());
        events.iter().filter_map(|event| renderer.render(event)).last().unwrap()
    };
    assert!(matches!(last(sample::cancelled_turn().unwrap()), AgnoEvent::TeamRunCancelled { .. }));
    assert!(
        matches!(last(sample::failed_turn().unwrap()), AgnoEvent::TeamRunError { error, .. } if error.contains("HTTP 500"))
    );
}

#[test]
fn adalflow_emits_every_run_item_name_and_a_final_result_with_the_step_history() {
    let mut names = BTreeSet::new();
    let mut raw = 0;
    let mut finals = Vec::new();
    for events in sample::all_turns().unwrap() {
        let mut renderer = AdalFlowRenderer::new();
        for event in &events {
            for rendered in renderer.render(event) {
                let value = serde_json::to_value(&rendered).unwrap();
                match rendered {
                    AdalFlowStreamEvent::RawResponse { .. } => raw += 1,
                    AdalFlowStreamEvent::RunItem { name, item } => {
                        names.insert(value["name"].as_str().unwrap().to_owned());
                        if let (RunItemName::FinalOutput, RunItem::FinalOutput(fields)) = (name, *item) {
                            finals.push(fields.data.unwrap());
                        }
                    }
                }
            }
        }
    }
    assert!(raw > 0);
    assert_eq!(names.len(), 7, "names: {names:?}");
    assert_eq!(finals.len(), 4);
    assert_eq!(finals[0].step_history.len(), 1);
    assert_eq!(
        finals[0].step_history[0].function.as_ref().unwrap().kwargs["expression"],
        json!("12 * (3 + 4)")
    );
    assert_eq!(finals[1].answer.as_deref(), Some("Hello! How can I help you today?"));
    assert_eq!(finals[2].error.as_deref(), Some("cancelled: client-cancelled"));
    assert!(finals[3].error.as_deref().unwrap().contains("HTTP 500"));
}

#[test]
fn ag_ui_starts_a_tool_call_once_its_id_and_name_are_both_known_and_keeps_early_arguments() {
    use agentry_types::{
        FinishReason, FunctionCallDelta, ModelMessageDelta, ThreadId, ToolCallDelta, TurnInputItem,
    };
    let main = ThreadId::main();
    let mut turn = sample::SampleTurn::start(vec![TurnInputItem::message("go")]);
    let id = agentry_types::EventId::new();
    let chunk = |id: Option<&str>, name: Option<&str>, arguments: Option<&str>| ModelMessageDelta {
        tool_calls: vec![ToolCallDelta {
            index: 0,
            id: id.map(str::to_owned),
            kind: None,
            function: Some(FunctionCallDelta {
                name: name.map(str::to_owned),
                arguments: arguments.map(str::to_owned),
            }),
            tool_info: None,
        }],
        ..ModelMessageDelta::default()
    };
    turn.delta(&main, id, ModelMessageDelta { reasoning_content: Some("hmm".into()), ..Default::default() })
        .unwrap();
    turn.delta(&main, id, chunk(None, Some("search"), Some("{\"q\":"))).unwrap();
    turn.delta(&main, id, chunk(Some("call_late"), None, Some("1}"))).unwrap();
    turn.delta(
        &main,
        id,
        ModelMessageDelta { finish_reason: Some(FinishReason::ToolCalls), ..Default::default() },
    )
    .unwrap();
    let events = turn.finish(agentry_types::TurnState::Error {
        message: "stop".into(),
        completed_at: Timestamp::now(),
        metrics: None,
    });
    let frames = agui(&events);
    assert_well_formed(&frames);
    let kinds: Vec<String> = frames
        .iter()
        .map(|f| serde_json::to_value(f).unwrap()["type"].as_str().unwrap().to_owned())
        .collect();
    let start = kinds.iter().position(|k| k == "TOOL_CALL_START").unwrap();
    assert!(
        kinds.iter().position(|k| k == "REASONING_END").unwrap() < start,
        "reasoning closes before the call"
    );
    let args: String = frames
        .iter()
        .filter_map(|f| match f {
            AguiEvent::ToolCallArgs { delta, tool_call_id, .. } if tool_call_id == "call_late" => {
                Some(delta.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(args, "{\"q\":1}");
}

#[test]
fn ag_ui_suspends_a_sub_agent_still_running_when_the_turn_waits_for_its_approval() {
    use agentry_events::{ThreadAgent, ThreadParent};
    use agentry_types::{
        PendingToolCall, RequiredAction, RequiredActionRecord, ThreadId, TurnInputItem, TurnState,
    };
    let sub = ThreadId::new_sub_thread();
    let mut turn = sample::SampleTurn::start(vec![TurnInputItem::message("go")]);
    turn.push(
        Some(sub.clone()),
        EventPayload::ThreadCreated {
            parent: ThreadParent { thread_id: ThreadId::main(), tool_call_id: "call_d".into() },
            agent: ThreadAgent { name: "mailer".into(), input: "send it".into(), model: None },
            title: "mailer".into(),
        },
    );
    let call = PendingToolCall {
        id: "call_mail".into(),
        source_event_id: agentry_types::EventId::new(),
        name: "send_email".into(),
        arguments: "{}".into(),
        may_have_run: false,
    };
    let events = turn.finish(TurnState::Done {
        output: None,
        required_actions: vec![RequiredActionRecord {
            id: agentry_types::EventId::new(),
            created_at: Timestamp::now(),
            action: RequiredAction::ToolApproval { thread_id: sub.clone(), tool_calls: vec![call] },
        }],
        completed_at: Timestamp::now(),
        metrics: None,
    });
    let frames = agui(&events);
    assert_well_formed(&frames);
    let finished = frames.iter().find_map(|f| match f {
        AguiEvent::SubagentFinished { subagent_run_id, outcome, .. } => {
            Some((subagent_run_id.clone(), outcome.clone()))
        }
        _ => None,
    });
    let (subagent, outcome) = finished.unwrap();
    assert_eq!(subagent, sub.to_string());
    assert_eq!(
        serde_json::to_value(outcome).unwrap(),
        json!({"type": "suspended", "interruptIds": ["call_mail"]})
    );
    let Some(AguiEvent::RunFinished { outcome: RunFinishedOutcome::Interrupt { interrupts }, .. }) =
        frames.last()
    else {
        panic!("the run ends with an interrupt");
    };
    assert_eq!(interrupts[0].subagent_run_id.as_deref(), Some(sub.to_string().as_str()));
}

#[test]
fn agno_nests_the_members_of_a_member_that_delegated() {
    use agentry_events::{ThreadAgent, ThreadOutcome, ThreadParent};
    use agentry_types::agno::MemberResponse;
    use agentry_types::{ThreadId, ThreadMessage, TurnInputItem, TurnState};
    let (lead, helper) = (ThreadId::new_sub_thread(), ThreadId::new_sub_thread());
    let mut turn = sample::SampleTurn::start(vec![TurnInputItem::message("go")]);
    let output = |thread: &ThreadId, text: &str| ThreadMessage {
        id: agentry_types::EventId::new(),
        thread_id: thread.clone(),
        created_at: Timestamp::now(),
        message: agentry_types::ModelMessage { content: Some(text.into()), ..Default::default() },
    };
    for (thread, parent, name) in [(&lead, ThreadId::main(), "lead"), (&helper, lead.clone(), "helper")] {
        turn.push(
            Some(thread.clone()),
            EventPayload::ThreadCreated {
                parent: ThreadParent { thread_id: parent, tool_call_id: format!("call_{name}") },
                agent: ThreadAgent { name: name.into(), input: "task".into(), model: None },
                title: name.into(),
            },
        );
    }
    for (thread, text) in [(&helper, "helped"), (&lead, "led")] {
        turn.push(
            Some(thread.clone()),
            EventPayload::ThreadDone {
                parent: None,
                title: "t".into(),
                outcome: ThreadOutcome::Done { output: Box::new(output(thread, text)) },
            },
        );
    }
    let events = turn.finish(TurnState::Done {
        output: None,
        required_actions: Vec::new(),
        completed_at: Timestamp::now(),
        metrics: None,
    });
    let mut renderer = AgnoRenderer::new(AgnoContext::default());
    let last = events.iter().filter_map(|event| renderer.render(event)).last().unwrap();
    let AgnoEvent::TeamRunCompleted { member_responses, .. } = last else {
        panic!("expected TeamRunCompleted")
    };
    assert_eq!(member_responses.len(), 1);
    let MemberResponse::Team(team) = &member_responses[0] else {
        panic!("the lead delegated, so it is a team")
    };
    assert_eq!(team.team_name.as_deref(), Some("lead"));
    assert_eq!(team.content, Some(json!("led")));
    let MemberResponse::Agent(helper_run) = &team.member_responses[0] else {
        panic!("the helper is an agent")
    };
    assert_eq!(helper_run.content, Some(json!("helped")));
}
