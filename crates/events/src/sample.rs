//! Sample turns covering every canonical event kind, for tests, fixtures, benchmarks and
//! the demo. Enabled by the `sample` feature.
//!
//! Each sample is a list of envelopes as a turn's emitter would number them: deltas
//! included, each completed message right after its last delta.

use agentry_types::{
    BudgetLimit, BudgetUsage, CancellationReason, ContentPart, DataUri, EventId, FilePart, FinishReason,
    McpServerAuth, MessageContent, ModelMessage, ModelMessageDelta, PendingToolCall, RequiredAction,
    RequiredActionRecord, SessionId, Subject, ThreadId, ThreadMessage, Timestamp, ToolCall, ToolCallKind,
    TurnId, TurnInputItem, TurnMetrics, TurnState, Usage, UserMessage,
};
use serde_json::json;

use crate::builder::MergeError;
use crate::envelope::{EventEnvelope, EventSource, TeamContext};
use crate::payload::{
    EventPayload, McpServerSession, McpTransport, ThreadAgent, ThreadOutcome, ThreadParent,
};
use crate::sequencer::{TurnEmitter, TurnSequencer};

/// Builds a sample turn event by event.
#[derive(Debug)]
pub struct SampleTurn {
    emitter: TurnEmitter,
    events: Vec<EventEnvelope>,
    messages: Vec<(ThreadId, EventId, ModelMessage)>,
}

impl SampleTurn {
    /// A turn of a new session, opened with `turn.created`.
    #[must_use]
    pub fn start(input: Vec<TurnInputItem>) -> Self {
        Self::start_in(SessionId::new(), None, input)
    }

    /// A turn of a session, chained on `previous`, opened with `turn.created`.
    #[must_use]
    pub fn start_in(session_id: SessionId, previous: Option<TurnId>, input: Vec<TurnInputItem>) -> Self {
        let mut turn = Self {
            emitter: TurnEmitter::new(TurnSequencer::new(session_id, TurnId::new())),
            events: Vec::new(),
            messages: Vec::new(),
        };
        turn.push(
            None,
            EventPayload::TurnCreated {
                previous_turn_id: previous,
                input,
                created_by: Subject::user("alice"),
            },
        );
        turn
    }

    /// Appends an event.
    pub fn push(&mut self, thread: Option<ThreadId>, payload: EventPayload) -> &mut Self {
        let event = self.emitter.emit(thread, payload);
        self.events.push(event);
        self
    }

    /// Appends a team event with its context.
    pub fn push_team(&mut self, team: TeamContext, payload: EventPayload) -> &mut Self {
        let event = self.emitter.emit_team(Some(ThreadId::main()), team, payload);
        self.events.push(event);
        self
    }

    /// Streams a message on a thread as deltas of `chunk` characters; returns its id.
    pub fn stream(
        &mut self,
        thread: &ThreadId,
        message: &ModelMessage,
        chunk: usize,
    ) -> Result<EventId, MergeError> {
        let id = EventId::new();
        for delta in message.to_deltas(chunk) {
            self.delta(thread, id, delta)?;
        }
        Ok(id)
    }

    /// Appends one delta of message `id`, and the message when the delta completes it.
    pub fn delta(
        &mut self,
        thread: &ThreadId,
        id: EventId,
        delta: ModelMessageDelta,
    ) -> Result<(), MergeError> {
        let emission = self.emitter.delta(thread.clone(), id, delta)?;
        self.events.push(emission.delta);
        if let Some(message) = emission.message {
            if let EventPayload::ModelMessage(built) = &message.payload {
                self.messages.push((thread.clone(), id, built.clone()));
            }
            self.events.push(message);
        }
        Ok(())
    }

    /// The recorded form of the last message streamed on a thread.
    #[must_use]
    pub fn last_message(&self, thread: &ThreadId) -> Option<ThreadMessage> {
        let (_, id, message) = self.messages.iter().rev().find(|(t, _, _)| t == thread)?;
        let created_at =
            self.events.iter().find(|e| e.event_id == *id).map_or_else(Timestamp::now, |e| e.created_at);
        Some(ThreadMessage { id: *id, thread_id: thread.clone(), created_at, message: message.clone() })
    }

    /// Ends the turn with `turn.done` and returns its events.
    #[must_use]
    pub fn finish(mut self, state: TurnState) -> Vec<EventEnvelope> {
        self.push(None, EventPayload::TurnDone { state });
        self.events
    }

    /// The events so far.
    #[must_use]
    pub fn events(&self) -> &[EventEnvelope] {
        &self.events
    }
}

fn usage(input: u64, output: u64) -> Usage {
    Usage { cache_read_tokens: Some(2), reasoning_tokens: Some(3), ..Usage::new(input, output) }
}

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall::function(id, name, arguments.to_string())
}

fn pending(id: &str, source: EventId, name: &str, arguments: serde_json::Value) -> PendingToolCall {
    PendingToolCall {
        id: id.to_owned(),
        source_event_id: source,
        name: name.to_owned(),
        arguments: arguments.to_string(),
        may_have_run: false,
    }
}

fn metrics() -> TurnMetrics {
    let mut metrics = TurnMetrics::default();
    metrics.add(&usage(120, 48));
    metrics.total_cost_in_usd = Some(0.0021);
    metrics
}

/// A team turn that uses every kind of event: MCP and sandbox set-up, reasoning, a
/// streamed message with two tool calls, a tool run, two concurrent sub-agent threads
/// (one fails), agent-team lifecycle events, memory updates, and an end that needs an
/// approval, a client-side answer and an MCP authorization.
pub fn everything_turn() -> Result<Vec<EventEnvelope>, MergeError> {
    let main = ThreadId::main();
    let file = DataUri::encode("text/plain", b"quarterly numbers").ok();
    let mut parts =
        vec![ContentPart::Text { text: "Summarize the attached report and email it.".to_owned() }];
    if let Some(data) = file {
        parts.push(ContentPart::File(FilePart { name: "report.txt".to_owned(), data }));
    }
    let mut turn = SampleTurn::start(vec![TurnInputItem::Message(UserMessage {
        content: MessageContent::Parts(parts),
    })]);
    turn.push(
        Some(main.clone()),
        EventPayload::McpInitialize {
            servers: vec![McpServerSession {
                id: "mcp_docs".to_owned(),
                name: "docs".to_owned(),
                session_id: Some("sess-42".to_owned()),
                transport: Some(McpTransport::StreamableHttp),
            }],
        },
    );
    turn.push(None, EventPayload::SandboxCreated { sandbox_id: "sbx_1".to_owned() });
    turn.push(Some(main.clone()), EventPayload::ReasoningStarted {});
    turn.push(
        Some(main.clone()),
        EventPayload::ReasoningStep {
            step: agentry_types::agno::ReasoningStep {
                title: Some("Plan".to_owned()),
                reasoning: Some("Compute the total, then delegate research.".to_owned()),
                confidence: Some(0.8),
                ..Default::default()
            },
        },
    );
    turn.push(Some(main.clone()), EventPayload::ReasoningCompleted {});

    let planning = ModelMessage {
        content: Some("Let me compute that and ask two colleagues.".to_owned()),
        reasoning_content: Some("The report needs a total first.".to_owned()),
        tool_calls: vec![
            call("call_calc", "calculator", json!({"expression": "12 * (3 + 4)"})),
            call(
                "call_research",
                "delegate_task_to_member",
                json!({"member": "researcher", "task": "Find context"}),
            ),
            call(
                "call_write",
                "delegate_task_to_member",
                json!({"member": "writer", "task": "Draft the email"}),
            ),
        ],
        finish_reason: Some(FinishReason::ToolCalls),
        usage: Some(usage(80, 30)),
        ..ModelMessage::default()
    };
    let planning_id = turn.stream(&main, &planning, 7)?;

    turn.push(
        Some(main.clone()),
        EventPayload::ToolCallStarted {
            tool_call_id: "call_calc".to_owned(),
            name: "calculator".to_owned(),
            arguments: json!({"expression": "12 * (3 + 4)"}).to_string(),
        },
    );
    turn.push(
        Some(main.clone()),
        EventPayload::ToolCallActivity {
            tool_call_id: "call_calc".to_owned(),
            data: json!({"progress": 0.5}),
        },
    );
    turn.push(
        Some(main.clone()),
        EventPayload::ToolResponse {
            tool_call_id: "call_calc".to_owned(),
            name: "calculator".to_owned(),
            arguments: json!({"expression": "12 * (3 + 4)"}).to_string(),
            content: "84".to_owned(),
            is_error: false,
        },
    );
    turn.push(
        Some(main.clone()),
        EventPayload::StepCompleted {
            step: 1,
            tool_call: Some(call("call_calc", "calculator", json!({"expression": "12 * (3 + 4)"}))),
            observation: Some("84".to_owned()),
        },
    );

    // Two member threads stream concurrently: their deltas interleave.
    let researcher = ThreadId::new_sub_thread();
    let writer = ThreadId::new_sub_thread();
    for (thread, name, call_id) in
        [(&researcher, "researcher", "call_research"), (&writer, "writer", "call_write")]
    {
        turn.push(
            Some(thread.clone()),
            EventPayload::ThreadCreated {
                parent: ThreadParent { thread_id: main.clone(), tool_call_id: call_id.to_owned() },
                agent: ThreadAgent {
                    name: name.to_owned(),
                    input: format!("Task for {name}"),
                    model: Some("scripted".to_owned()),
                },
                title: format!("{name} thread"),
            },
        );
    }
    let research = ModelMessage {
        content: Some("Revenue grew 12% over the quarter.".to_owned()),
        finish_reason: Some(FinishReason::Stop),
        usage: Some(usage(20, 9)),
        ..ModelMessage::default()
    };
    let writing = ModelMessage {
        content: Some("Draft: the numbers look good.".to_owned()),
        finish_reason: Some(FinishReason::Stop),
        usage: Some(usage(18, 7)),
        ..ModelMessage::default()
    };
    let research_deltas = research.to_deltas(5);
    let writing_deltas = writing.to_deltas(5);
    let (research_id, writing_id) = (EventId::new(), EventId::new());
    let longest = research_deltas.len().max(writing_deltas.len());
    for index in 0..longest {
        for (thread, id, deltas) in
            [(&researcher, research_id, &research_deltas), (&writer, writing_id, &writing_deltas)]
        {
            if let Some(delta) = deltas.get(index) {
                turn.delta(thread, id, delta.clone())?;
            }
        }
    }
    let team = |instance: &str| TeamContext {
        mission_id: Some("m1".to_owned()),
        instance_id: Some(instance.to_owned()),
        parent_instance_id: Some("ins_coordinator".to_owned()),
        source: Some(EventSource::ToolCall),
        message_id: Some(planning_id.to_string()),
        tool_call_id: None,
    };
    turn.push_team(
        team("ins_research"),
        EventPayload::SpawnRequested {
            requested_role: "worker".to_owned(),
            template: Some("researcher".to_owned()),
            task: Some("Find context".to_owned()),
            justification: Some("needs outside facts".to_owned()),
            budget_override: Some(BudgetLimit { max_tokens: Some(8000), ..BudgetLimit::default() }),
        },
    );
    turn.push_team(
        team("ins_research"),
        EventPayload::SpawnApproved {
            requested_role: "worker".to_owned(),
            approval_id: Some("appr_1".to_owned()),
        },
    );
    turn.push_team(
        team("ins_research"),
        EventPayload::InstanceStarted {
            role: "worker".to_owned(),
            status: "running".to_owned(),
            budget_limit: BudgetLimit { max_tokens: Some(8000), ..BudgetLimit::default() },
            skill_hash: Some("sha256:0f1e2d".to_owned()),
        },
    );
    let used = BudgetUsage {
        tokens_used: 29,
        steps_used: 1,
        tool_calls_used: 0,
        cost_used_usd: 0.0004,
        elapsed_ms: Some(850),
    };
    turn.push_team(
        team("ins_research"),
        EventPayload::BudgetUsage {
            usage: used,
            limit: Some(BudgetLimit { max_tokens: Some(8000), ..BudgetLimit::default() }),
        },
    );
    turn.push_team(
        team("ins_research"),
        EventPayload::CapabilityDenied {
            tool: "websearch".to_owned(),
            reason: "network disabled for this agent instance".to_owned(),
        },
    );
    if let Some(output) = turn.last_message(&researcher) {
        turn.push(
            Some(researcher.clone()),
            EventPayload::ThreadDone {
                parent: Some(ThreadParent {
                    thread_id: main.clone(),
                    tool_call_id: "call_research".to_owned(),
                }),
                title: "researcher thread".to_owned(),
                outcome: ThreadOutcome::Done { output: Box::new(output) },
            },
        );
    }
    turn.push_team(
        team("ins_research"),
        EventPayload::InstanceCompleted {
            output: Some("Revenue grew 12% over the quarter.".to_owned()),
            usage: Some(used),
        },
    );
    turn.push(
        Some(writer.clone()),
        EventPayload::ThreadDone {
            parent: Some(ThreadParent { thread_id: main.clone(), tool_call_id: "call_write".to_owned() }),
            title: "writer thread".to_owned(),
            outcome: ThreadOutcome::Error {
                error: "the writer ran out of budget".to_owned(),
                output: turn.last_message(&writer).map(Box::new),
            },
        },
    );
    turn.push_team(
        team("ins_write"),
        EventPayload::InstanceFailed { error: "the writer ran out of budget".to_owned() },
    );
    turn.push(
        Some(main.clone()),
        EventPayload::IntermediateContent { content: json!({"total": 84}), content_type: "dict".to_owned() },
    );

    let asking = ModelMessage {
        content: Some("I will email the summary once you approve.".to_owned()),
        tool_calls: vec![
            call("call_email", "send_email", json!({"to": "boss@example.com", "subject": "Q3"})),
            call(
                "call_ask",
                "ask_user_question",
                json!({"question": "Formal or casual?", "options": ["formal", "casual"]}),
            ),
        ],
        finish_reason: Some(FinishReason::ToolCalls),
        usage: Some(usage(40, 18)),
        ..ModelMessage::default()
    };
    let asking_id = turn.stream(&main, &asking, 9)?;
    let approvals = vec![pending(
        "call_email",
        asking_id,
        "send_email",
        json!({"to": "boss@example.com", "subject": "Q3"}),
    )];
    let questions = vec![pending(
        "call_ask",
        asking_id,
        "ask_user_question",
        json!({"question": "Formal or casual?", "options": ["formal", "casual"]}),
    )];
    let servers = vec![McpServerAuth {
        id: "mcp_mail".to_owned(),
        name: "mail".to_owned(),
        auth_url: "https://auth.example.com/mail".to_owned(),
    }];
    turn.push(Some(main.clone()), EventPayload::ToolApprovalRequired { tool_calls: approvals.clone() });
    turn.push(Some(main.clone()), EventPayload::ToolResponseRequired { tool_calls: questions.clone() });
    turn.push(Some(main.clone()), EventPayload::McpAuthRequired { servers: servers.clone() });
    turn.push(Some(main.clone()), EventPayload::MemoryUpdateStarted {});
    turn.push(Some(main.clone()), EventPayload::MemoryUpdateCompleted { error: None });

    let required: Vec<RequiredActionRecord> = turn
        .events()
        .iter()
        .filter_map(|event| {
            let action = match &event.payload {
                EventPayload::ToolApprovalRequired { tool_calls } => RequiredAction::ToolApproval {
                    thread_id: event.thread_or_main(),
                    tool_calls: tool_calls.clone(),
                },
                EventPayload::ToolResponseRequired { tool_calls } => RequiredAction::ToolResponse {
                    thread_id: event.thread_or_main(),
                    tool_calls: tool_calls.clone(),
                },
                EventPayload::McpAuthRequired { servers } => {
                    RequiredAction::McpAuth { thread_id: event.thread_id.clone(), servers: servers.clone() }
                }
                _ => return None,
            };
            Some(RequiredActionRecord { id: event.event_id, created_at: event.created_at, action })
        })
        .collect();
    let output = turn.last_message(&main).map(Box::new);
    Ok(turn.finish(TurnState::Done {
        output,
        required_actions: required,
        completed_at: Timestamp::now(),
        metrics: Some(metrics()),
    }))
}

/// A simple turn: a question, a streamed answer, done.
pub fn answer_turn(question: &str, answer: &str) -> Result<Vec<EventEnvelope>, MergeError> {
    let main = ThreadId::main();
    let mut turn = SampleTurn::start(vec![TurnInputItem::message(question)]);
    let message = ModelMessage {
        content: Some(answer.to_owned()),
        finish_reason: Some(FinishReason::Stop),
        usage: Some(Usage::new(12, 6)),
        ..ModelMessage::default()
    };
    turn.stream(&main, &message, 4)?;
    let output = turn.last_message(&main).map(Box::new);
    Ok(turn.finish(TurnState::Done {
        output,
        required_actions: Vec::new(),
        completed_at: Timestamp::now(),
        metrics: Some(metrics()),
    }))
}

/// A turn cancelled by its client while the answer streamed, with budget exhaustion
/// events on the way.
pub fn cancelled_turn() -> Result<Vec<EventEnvelope>, MergeError> {
    let main = ThreadId::main();
    let mut turn = SampleTurn::start(vec![TurnInputItem::message("Write a long story")]);
    let message = ModelMessage { content: Some("Once upon a time".to_owned()), ..ModelMessage::default() };
    let id = EventId::new();
    for delta in message.to_deltas(4).into_iter().filter(|delta| delta.finish_reason.is_none()) {
        turn.delta(&main, id, delta)?;
    }
    if let Some(partial) = turn.emitter.finish_partial(&main) {
        turn.events.push(partial);
    }
    let team = TeamContext {
        mission_id: Some("m1".to_owned()),
        instance_id: Some("ins_123".to_owned()),
        source: Some(EventSource::OrchestratorRuntime),
        ..TeamContext::default()
    };
    let usage = BudgetUsage {
        tokens_used: 1200,
        steps_used: 3,
        tool_calls_used: 10,
        cost_used_usd: 0.42,
        elapsed_ms: Some(42_000),
    };
    turn.push_team(
        team.clone(),
        EventPayload::BudgetExhausted { exhausted_by: "max_tool_calls".to_owned(), usage },
    );
    turn.push_team(
        TeamContext { instance_id: None, ..team.clone() },
        EventPayload::MissionBudgetExhausted {
            exhausted_by: "mission_max_tokens".to_owned(),
            usage: BudgetUsage {
                tokens_used: 40_000,
                steps_used: 22,
                tool_calls_used: 61,
                cost_used_usd: 5.61,
                elapsed_ms: None,
            },
        },
    );
    turn.push_team(
        team.clone(),
        EventPayload::InstanceCancelled { reason: Some("budget exhausted".to_owned()) },
    );
    turn.push_team(
        TeamContext { instance_id: None, source: Some(EventSource::UiAction), ..team },
        EventPayload::SpawnDenied {
            requested_role: "worker".to_owned(),
            code: "spawn_policy_missing".to_owned(),
            error: "spawn policy file missing".to_owned(),
        },
    );
    Ok(turn.finish(TurnState::Cancelled {
        reason: CancellationReason::ClientCancelled,
        completed_at: Timestamp::now(),
        metrics: None,
    }))
}

/// A turn that fails: the provider errored after a tool call.
pub fn failed_turn() -> Result<Vec<EventEnvelope>, MergeError> {
    let main = ThreadId::main();
    let mut turn = SampleTurn::start(vec![TurnInputItem::message("What is the weather?")]);
    let message = ModelMessage {
        tool_calls: vec![ToolCall {
            kind: ToolCallKind::Function,
            ..call("call_w", "weather", json!({"city": "Oslo"}))
        }],
        finish_reason: Some(FinishReason::ToolCalls),
        usage: Some(Usage::new(10, 4)),
        ..ModelMessage::default()
    };
    turn.stream(&main, &message, 3)?;
    turn.push(
        Some(main),
        EventPayload::ToolResponse {
            tool_call_id: "call_w".to_owned(),
            name: "weather".to_owned(),
            arguments: json!({"city": "Oslo"}).to_string(),
            content: "error: the weather service timed out".to_owned(),
            is_error: true,
        },
    );
    Ok(turn.finish(TurnState::Error {
        message: "model provider returned HTTP 500: overloaded".to_owned(),
        completed_at: Timestamp::now(),
        metrics: None,
    }))
}

/// Every sample turn.
pub fn all_turns() -> Result<Vec<Vec<EventEnvelope>>, MergeError> {
    Ok(vec![
        everything_turn()?,
        answer_turn("Hi!", "Hello! How can I help you today?")?,
        cancelled_turn()?,
        failed_turn()?,
    ])
}
