//! `cargo xtask demo`: drives one scripted turn and prints its event stream as the harness
//! API would send it (SSE frames), then the assembled answer.
//!
//! The scripted model first calls a calculator tool, then answers with the result; the
//! demo runs the tool, numbers every event with a turn emitter, and renders each one.

use std::io::Write;

use agentry_events::render::harness;
use agentry_events::{EventEnvelope, EventPayload, TurnEmitter, TurnSequencer};
use agentry_model::{Model, ModelRequest, ScriptedModel, ScriptedResponse};
use agentry_types::{
    EventId, Message, ModelMessage, SessionId, Subject, ThreadId, ThreadMessage, Timestamp, ToolSpec, TurnId,
    TurnInputItem, TurnMetrics, TurnState,
};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde_json::json;

/// Evaluates `a op b` for the demo's calculator tool.
fn calculate(expression: &str) -> Result<f64> {
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let [a, op, b] = parts.as_slice() else { bail!("expected `a op b`, got {expression:?}") };
    let (a, b): (f64, f64) = (a.parse()?, b.parse()?);
    Ok(match *op {
        "+" => a + b,
        "-" => a - b,
        "*" => a * b,
        "/" if b != 0.0 => a / b,
        _ => bail!("unsupported operator {op:?}"),
    })
}

/// Runs the demo, writing the stream to `out`.
pub async fn run(question: &str, out: &mut impl Write) -> Result<()> {
    let model = ScriptedModel::responder(|request: &ModelRequest| {
        let tool_result = request.messages.iter().rev().find(|m| m.role == agentry_types::Role::Tool);
        match tool_result {
            Some(result) => ScriptedResponse::text(format!("The result is {}.", result.text())).chunked(5),
            None => ScriptedResponse::text("Let me calculate that.")
                .with_tool_call("calculator", &json!({ "expression": "6 * 7" }))
                .chunked(5),
        }
    });
    let tools = vec![ToolSpec {
        name: "calculator".to_owned(),
        description: Some("Evaluates `a op b`.".to_owned()),
        parameters: json!({ "type": "object", "properties": { "expression": { "type": "string" } }, "required": ["expression"] }),
    }];
    let (session_id, turn_id) = (SessionId::new(), TurnId::new());
    let mut emitter = TurnEmitter::new(TurnSequencer::new(session_id, turn_id));
    let main = ThreadId::main();
    let print = |event: &EventEnvelope, out: &mut dyn Write| -> Result<()> {
        if let Some(rendered) = harness::render(event) {
            out.write_all(harness::sse_frame(event.seq, &rendered).as_bytes())?;
        }
        Ok(())
    };

    let created = emitter.emit(
        None,
        EventPayload::TurnCreated {
            previous_turn_id: None,
            input: vec![TurnInputItem::message(question)],
            created_by: Subject::user("demo"),
        },
    );
    print(&created, out)?;

    let mut messages = vec![Message::system("You are a helpful calculator."), Message::user(question)];
    let mut metrics = TurnMetrics::default();
    let mut last: Option<ThreadMessage> = None;
    for _ in 0..4 {
        let request = ModelRequest::new(messages.clone()).with_tools(tools.clone());
        let mut stream = model.stream(request).await.context("starting the model stream")?;
        let message_id = EventId::new();
        let mut finished: Option<(EventEnvelope, ModelMessage)> = None;
        while let Some(delta) = stream.next().await {
            let emission = emitter.delta(main.clone(), message_id, delta?)?;
            print(&emission.delta, out)?;
            if let Some(message) = emission.message {
                print(&message, out)?;
                if let EventPayload::ModelMessage(built) = &message.payload {
                    finished = Some((message.clone(), built.clone()));
                }
            }
        }
        let (envelope, message) = finished.context("the model stream ended without finishing its message")?;
        if let Some(usage) = &message.usage {
            metrics.add(usage);
        }
        messages.push(Message::from_model(&message));
        last = Some(ThreadMessage {
            id: envelope.event_id,
            thread_id: main.clone(),
            created_at: envelope.created_at,
            message: message.clone(),
        });
        if message.tool_calls.is_empty() {
            break;
        }
        for call in &message.tool_calls {
            let arguments: serde_json::Value = serde_json::from_str(&call.function.arguments)?;
            let expression = arguments["expression"].as_str().unwrap_or_default();
            let content = match calculate(expression) {
                Ok(value) => value.to_string(),
                Err(error) => format!("error: {error}"),
            };
            let response = emitter.emit(
                Some(main.clone()),
                EventPayload::ToolResponse {
                    tool_call_id: call.id.clone(),
                    name: call.function.name.clone(),
                    arguments: call.function.arguments.clone(),
                    content: content.clone(),
                    is_error: content.starts_with("error"),
                },
            );
            print(&response, out)?;
            messages.push(Message::tool(call.id.clone(), content));
        }
    }

    let answer = last.as_ref().and_then(|message| message.message.content.clone()).unwrap_or_default();
    let done = emitter.emit(
        None,
        EventPayload::TurnDone {
            state: TurnState::Done {
                output: last.map(Box::new),
                required_actions: Vec::new(),
                completed_at: Timestamp::now(),
                metrics: Some(metrics),
            },
        },
    );
    print(&done, out)?;
    writeln!(out, ": answer: {answer}")?;
    Ok(())
}
