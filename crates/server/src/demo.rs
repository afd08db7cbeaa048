//! The embedded demo agents: `demo` (one agent, rules on the latest user message) and
//! `demo-team` (a coordinate-mode team), both on a deterministic scripted model, so the
//! server does something useful with no provider key and tests get stable answers.
//!
//! `demo`, first matching rule on the latest user message:
//! - contains `calculate <expression>`: calls the server-side `calculator` tool, then
//!   answers `The result is <value>.`;
//! - contains `email`: calls `send_email`, which requires approval, then answers
//!   `Email sent.` or `Email not sent: <reason>.`;
//! - contains `ask me`: calls the client-side `ask_user_question`, then answers
//!   `You chose <answer>.`;
//! - contains `slow`: streams 200 deltas over about 10 seconds;
//! - anything else: `Echo: <message>`, streamed as several deltas.
//!
//! `demo-team`: the coordinator delegates the message to `researcher` and `writer` at once
//! and answers with both results (the writer first emails a message containing `email`,
//! which needs approval); a message containing `spawn` spawns an `analyst` instead
//! (an analyst given a task containing `slow` works for about 10 seconds).

use std::sync::Arc;
use std::time::Duration;

use agentry_model::{ModelRequest, ScriptedModel, ScriptedResponse, ScriptedToolCall};
use agentry_runner::{Agent, AgentLimits, FunctionTool, Tool, ToolError};
use agentry_team::{SpawnApprovals, SpawnCatalog, SpawnPolicy, Team, TeamControl};
use agentry_types::{CLIENT_CONTEXT_HEADING, Message, Role, ToolCall};
use serde_json::json;

/// The demo agent's name.
pub const DEMO_AGENT: &str = "demo";
/// The demo team's name.
pub const DEMO_TEAM: &str = "demo-team";

/// The prefix the runner gives a denied call's result.
const DENIED: &str = "The user denied this tool call";

/// Evaluates an arithmetic expression: numbers, `+ - * /`, unary minus and parentheses.
///
/// Errors: a message saying what is wrong (an unexpected character, a missing
/// parenthesis, a division by zero).
pub fn calculate(expression: &str) -> Result<f64, String> {
    if expression.len() > MAX_EXPRESSION {
        return Err(format!("the expression is longer than {MAX_EXPRESSION} characters"));
    }
    let tokens: Vec<char> = expression.chars().filter(|c| !c.is_whitespace()).collect();
    let mut parser = Arithmetic { tokens: &tokens, at: 0, depth: 0 };
    let value = parser.sum()?;
    if parser.at != tokens.len() {
        return Err(format!("unexpected {:?} in {expression:?}", tokens[parser.at]));
    }
    if value.is_finite() { Ok(value) } else { Err(format!("{expression:?} has no finite value")) }
}

/// The longest expression the calculator evaluates.
const MAX_EXPRESSION: usize = 1000;
/// The deepest nesting of parentheses and signs it follows.
const MAX_DEPTH: usize = 64;

struct Arithmetic<'a> {
    tokens: &'a [char],
    at: usize,
    depth: usize,
}

impl Arithmetic<'_> {
    fn peek(&self) -> Option<char> {
        self.tokens.get(self.at).copied()
    }

    fn sum(&mut self) -> Result<f64, String> {
        let mut value = self.product()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.at += 1;
            let rhs = self.product()?;
            value = if op == '+' { value + rhs } else { value - rhs };
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<f64, String> {
        let mut value = self.factor()?;
        while let Some(op @ ('*' | 'x' | '/')) = self.peek() {
            self.at += 1;
            let rhs = self.factor()?;
            if op == '/' {
                if rhs == 0.0 {
                    return Err("division by zero".to_owned());
                }
                value /= rhs;
            } else {
                value *= rhs;
            }
        }
        Ok(value)
    }

    fn factor(&mut self) -> Result<f64, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("the expression nests deeper than {MAX_DEPTH} levels"));
        }
        let value = self.unary();
        self.depth -= 1;
        value
    }

    fn unary(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some('-') => {
                self.at += 1;
                Ok(-self.factor()?)
            }
            Some('(') => {
                self.at += 1;
                let value = self.sum()?;
                if self.peek() != Some(')') {
                    return Err("missing `)`".to_owned());
                }
                self.at += 1;
                Ok(value)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                let start = self.at;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == '.') {
                    self.at += 1;
                }
                let number: String = self.tokens[start..self.at].iter().collect();
                number.parse().map_err(|_| format!("{number:?} is not a number"))
            }
            Some(c) => Err(format!("unexpected {c:?}")),
            None => Err("the expression ended early".to_owned()),
        }
    }
}

/// A number as people write it: `42`, not `42.0`.
fn show(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 { format!("{value:.0}") } else { value.to_string() }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Calculation {
    /// An arithmetic expression: numbers, + - * /, parentheses.
    expression: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Email {
    /// The recipient.
    to: String,
    /// The subject line.
    subject: String,
    /// The text.
    body: String,
}

/// The latest user message of a request, as text.
fn latest_user_text(request: &ModelRequest) -> String {
    request
        .messages
        .iter()
        .rev()
        .find(|message| message.role == Role::User)
        .map(|message| message.text())
        .unwrap_or_default()
}

/// The tool call whose result `result` is, from the assistant message that made it.
fn call_of<'a>(request: &'a ModelRequest, result: &Message) -> Option<&'a ToolCall> {
    let id = result.tool_call_id.as_deref()?;
    request.messages.iter().flat_map(|message| &message.tool_calls).find(|call| call.id == id)
}

/// What `demo` answers to a request.
fn demo_response(request: &ModelRequest) -> ScriptedResponse {
    if let Some(result) = request.messages.last().filter(|message| message.role == Role::Tool) {
        let text = result.text();
        let answer = match call_of(request, result).map(|call| call.function.name.as_str()) {
            Some("calculator") if result_failed(&text) => format!("I could not calculate that: {text}."),
            Some("calculator") => format!("The result is {text}."),
            Some("send_email") => match text.strip_prefix(DENIED) {
                Some(rest) => {
                    let reason = rest.trim_start_matches(':').trim().trim_end_matches('.');
                    let reason = if reason.is_empty() { "no reason given" } else { reason };
                    format!("Email not sent: {reason}.")
                }
                None => "Email sent.".to_owned(),
            },
            Some("ask_user_question") => format!("You chose {text}."),
            _ => format!("Done: {text}"),
        };
        return ScriptedResponse::text(answer).chunked(6);
    }
    let message = latest_user_text(request);
    // ASCII lowercasing keeps every byte where it was, so positions found in `lower` are
    // positions in `message`.
    let lower = message.to_ascii_lowercase();
    if let Some(at) = lower.find("calculate ") {
        let expression = message[at + "calculate ".len()..].trim().trim_end_matches(['?', '.', '!']).trim();
        return ScriptedResponse::text("Let me calculate that.")
            .with_tool_call("calculator", &json!({ "expression": expression }))
            .chunked(6);
    }
    if lower.contains("email") {
        return ScriptedResponse::text("I will send that email.")
            .with_tool_call(
                "send_email",
                &json!({"to": "team@example.com", "subject": "A message from the demo", "body": message}),
            )
            .chunked(6);
    }
    if lower.contains("ask me") {
        return ScriptedResponse::tool_call(
            "ask_user_question",
            &json!({"question": "Which color do you like best?", "options": ["red", "green", "blue"]}),
        );
    }
    // `use <tool>` calls a tool the request offers by that name: a client's own (an AG-UI
    // frontend tool), whose result the client sends with its next run.
    if let Some(name) = lower.strip_prefix("use ").map(str::trim)
        && let Some(tool) = request.tools.iter().find(|tool| tool.name.to_ascii_lowercase() == name)
    {
        return ScriptedResponse::text(format!("Calling {}.", tool.name))
            .with_tool_call(tool.name.clone(), &json!({}));
    }
    // `what do you see` answers with the context the client gave for this run (an AG-UI
    // client's `context`), as the system prompt shows it to a model.
    if lower.contains("what do you see") {
        let system = request
            .messages
            .iter()
            .find(|message| message.role == Role::System)
            .map(|message| message.text());
        let seen = system.as_deref().and_then(|system| system.split_once(CLIENT_CONTEXT_HEADING)).map(
            |(_, items)| {
                items.lines().filter_map(|line| line.strip_prefix("- ")).collect::<Vec<_>>().join("; ")
            },
        );
        return ScriptedResponse::text(match seen.filter(|seen| !seen.is_empty()) {
            Some(seen) => format!("I see {seen}."),
            None => "I see no context from your application.".to_owned(),
        })
        .chunked(6);
    }
    if lower.contains("slow") {
        let text: String = (0..200).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        return ScriptedResponse::text(text).chunked(1).delayed(Duration::from_millis(50));
    }
    ScriptedResponse::text(format!("Echo: {message}")).chunked(4)
}

/// Whether a tool result is an error the calculator returned.
fn result_failed(text: &str) -> bool {
    text.parse::<f64>().is_err()
}

/// The built-in `calculator` tool.
#[must_use]
pub fn calculator_tool() -> Arc<dyn Tool> {
    FunctionTool::new(
        "calculator",
        "Evaluates an arithmetic expression (numbers, + - * /, parentheses).",
        |args: Calculation, _| async move { calculate(&args.expression).map(show).map_err(ToolError::Failed) },
    )
    .idempotent()
    .shared()
}

/// The built-in `send_email` tool (it only logs the recipient: nothing is sent).
#[must_use]
pub fn send_email_tool() -> Arc<dyn Tool> {
    FunctionTool::new("send_email", "Sends an email.", |args: Email, _| async move {
        tracing::info!(to = %args.to, subject = %args.subject, bytes = args.body.len(), "demo email \"sent\"");
        Ok::<_, ToolError>(format!("Sent to {}.", args.to))
    })
    .shared()
}

/// The `demo` agent.
#[must_use]
pub fn demo_agent() -> Agent {
    demo_agent_with(DEMO_AGENT, AgentLimits::default())
}

/// The demo agent's rules under another name, with these limits.
#[must_use]
pub fn demo_agent_with(name: &str, limits: AgentLimits) -> Agent {
    let model = ScriptedModel::responder(demo_response)
        .named("demo-rules")
        .without_request_log()
        .with_unique_call_ids();
    Agent::builder(name, Arc::new(model))
        .instructions("You are Agentry's demo agent.")
        .tool(calculator_tool())
        .tool(send_email_tool())
        .requires_approval("send_email")
        .ask_user_question()
        .limits(limits)
        .build()
}

/// A member of the demo team, answering `<prefix> <task>`; one that `mails` first sends a
/// task containing `email` with `send_email` (which requires approval), and says whether
/// it went.
fn member(name: &str, prefix: &'static str, mails: bool) -> Agent {
    let model = ScriptedModel::responder(move |request: &ModelRequest| {
        let task = latest_user_text(request);
        match request.messages.last().filter(|message| message.role == Role::Tool) {
            Some(result) if result.text().starts_with("Sent to ") => {
                ScriptedResponse::text(format!("{prefix} {task} (emailed)")).chunked(6)
            }
            Some(result) => {
                ScriptedResponse::text(format!("{prefix} {task} (not emailed: {})", result.text())).chunked(6)
            }
            None if mails && task.to_ascii_lowercase().contains("email") => ScriptedResponse::tool_call(
                "send_email",
                &json!({"to": "team@example.com", "subject": "From the demo team", "body": task}),
            ),
            None => ScriptedResponse::text(format!("{prefix} {task}")).chunked(6),
        }
    })
    .named(format!("demo-{name}"))
    .without_request_log()
    .with_unique_call_ids();
    let member = Agent::builder(name, Arc::new(model)).instructions(format!("You are the team's {name}."));
    if mails {
        member.tool(send_email_tool()).requires_approval("send_email").build()
    } else {
        member.build()
    }
}

/// The demo team's spawn policy: the coordinator may spawn `analyst` instances.
pub const DEMO_SPAWN_POLICY: &str = r#"
coordinator_role = "coordinator"

[roles.coordinator]
can_spawn = ["analyst", "auditor"]

[roles.analyst]
require_justification = true
max_instances = 4
budget = { max_tokens = 8000, max_tool_calls = 10 }
[roles.analyst.templates.default]
instructions = "You analyse one question and answer briefly."
model = "demo-analyst"

[roles.auditor]
require_approval = true
max_instances = 4
budget = { max_tokens = 8000 }
[roles.auditor.templates.default]
instructions = "You audit one piece of work."
model = "demo-analyst"
"#;

/// What the demo team's coordinator answers: for a message containing `spawn`, one
/// `spawn_agent` call for an analyst; otherwise one message delegating to both members.
/// Then the answer built from the results of this exchange (after the latest user
/// message: a turn that goes on after an approval answers with the results an earlier
/// turn gave too).
fn coordinator_response(request: &ModelRequest) -> ScriptedResponse {
    let exchange =
        request.messages.iter().rposition(|message| message.role == Role::User).map_or(0, |at| at + 1);
    let results: Vec<(String, String)> = request.messages[exchange..]
        .iter()
        .filter(|message| message.role == Role::Tool)
        .map(|result| (called_member(request, result).unwrap_or_else(|| "analyst".to_owned()), result.text()))
        .collect();
    if results.is_empty() {
        let task = latest_user_text(request);
        if task.to_lowercase().contains("spawn") {
            return ScriptedResponse::text("Spawning an analyst.").chunked(6).with_tool_call(
                "spawn_agent",
                &json!({"role": "analyst", "task": task, "justification": "The user asked for an analyst."}),
            );
        }
        let mut both = ScriptedResponse::text("Asking the researcher and the writer.").chunked(6);
        for member in ["researcher", "writer"] {
            both.tool_calls.push(ScriptedToolCall {
                id: None,
                name: "delegate_task_to_member".to_owned(),
                arguments: json!({"member_id": member, "task": task}).to_string(),
            });
        }
        return both;
    }
    let parts: Vec<String> = results.iter().map(|(member, text)| format!("{member}: {text}")).collect();
    ScriptedResponse::text(format!("The team answered. {}", parts.join(" | "))).chunked(6)
}

/// The member a delegation result came from.
fn called_member(request: &ModelRequest, result: &Message) -> Option<String> {
    let call = call_of(request, result)?;
    let arguments: serde_json::Value = serde_json::from_str(&call.function.arguments).ok()?;
    arguments.get("member_id").and_then(|member| member.as_str()).map(str::to_owned)
}

/// The `demo-team` team, with its spawn policy; spawn approvals and instance control are
/// shared with the server's agent-team routes.
///
/// # Panics
/// Never: the embedded policy is valid (a unit test parses it).
#[must_use]
pub fn demo_team(approvals: &SpawnApprovals, control: &TeamControl) -> (Agent, SpawnPolicy) {
    let model = ScriptedModel::responder(coordinator_response)
        .named("demo-coordinator")
        .without_request_log()
        .with_unique_call_ids();
    let analyst: Arc<dyn agentry_model::Model> = Arc::new(
        ScriptedModel::responder(|request: &ModelRequest| {
            let task = latest_user_text(request);
            let answer = ScriptedResponse::text(format!("Analysis of: {task}")).chunked(6);
            // A task asking for slow work streams for about 10 seconds (to cancel it).
            if task.to_ascii_lowercase().contains("slow") {
                answer.chunked(1).delayed(Duration::from_millis(200))
            } else {
                answer
            }
        })
        .named("demo-analyst")
        .without_request_log()
        .with_unique_call_ids(),
    );
    #[allow(clippy::expect_used)]
    let policy = SpawnPolicy::parse(DEMO_SPAWN_POLICY).expect("the embedded spawn policy is valid");
    let team = Team::builder(DEMO_TEAM, Arc::new(model))
        .instructions("Delegate the request to the researcher and the writer, then answer with both results.")
        .member(member("researcher", "Research notes on:", false))
        .member(member("writer", "Draft about:", true))
        .spawn_policy(Some(policy.clone()))
        .catalog(SpawnCatalog {
            models: std::collections::HashMap::from([("demo-analyst".to_owned(), analyst)]),
            tools: Vec::new(),
        })
        .approvals(approvals.clone())
        .control(control.clone())
        .build();
    (team, policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_team_answers_with_every_result_of_the_exchange_after_an_approval() {
        use agentry_types::ContextMessage;
        let mut asked = Message::assistant("Asking the researcher and the writer.");
        asked.tool_calls = ["researcher", "writer"]
            .iter()
            .enumerate()
            .map(|(index, member)| {
                let arguments = json!({"member_id": member, "task": "email the plan"}).to_string();
                ToolCall::function(format!("call_{index}"), "delegate_task_to_member", arguments)
            })
            .collect();
        // The turn that goes on after the writer's approval: the researcher answered in
        // the turn before (replayed), the writer in this one.
        let replayed = |message: Message| ContextMessage::replayed(Arc::new(message));
        let request = ModelRequest::new([
            replayed(Message::user("earlier")),
            replayed(Message::assistant("The team answered earlier.")),
            replayed(Message::user("email the plan")),
            replayed(asked),
            replayed(Message::tool("call_0", "Research notes")),
            ContextMessage::from(Message::tool("call_1", "Draft (emailed)")),
        ]);
        let answer = coordinator_response(&request);
        assert_eq!(
            answer.text.as_deref(),
            Some("The team answered. researcher: Research notes | writer: Draft (emailed)")
        );
        assert!(answer.tool_calls.is_empty());
    }

    #[test]
    fn arithmetic_follows_precedence_and_parentheses() {
        assert_eq!(calculate("6 * 7").unwrap(), 42.0);
        assert_eq!(calculate("2 + 3 * 4").unwrap(), 14.0);
        assert_eq!(calculate("(2 + 3) * 4").unwrap(), 20.0);
        assert_eq!(calculate("-1.5 + 4 / 2").unwrap(), 0.5);
        assert_eq!(show(calculate("10 / 4").unwrap()), "2.5");
        assert_eq!(show(42.0), "42");
    }

    #[test]
    fn rules_match_case_insensitively_without_misplacing_the_expression() {
        let request = |text: &str| ModelRequest::new(vec![Message::user(text)]);
        let response = demo_response(&request("ȺȺȺ CALCULATE 2 * 3"));
        assert_eq!(response.tool_calls[0].arguments, r#"{"expression":"2 * 3"}"#);
        let echoed = demo_response(&request("ȺȺȺ hello"));
        assert_eq!(echoed.text.as_deref(), Some("Echo: ȺȺȺ hello"));
    }

    #[test]
    fn the_demo_spawn_policy_parses() {
        let policy = SpawnPolicy::parse(DEMO_SPAWN_POLICY).unwrap();
        assert_eq!(policy.roles["coordinator"].can_spawn, ["analyst", "auditor"]);
        assert!(policy.roles["auditor"].require_approval);
    }

    #[test]
    fn bad_arithmetic_is_a_clear_error() {
        assert_eq!(calculate("1 / 0").unwrap_err(), "division by zero");
        assert!(calculate("(1 + 2").unwrap_err().contains("missing `)`"));
        assert!(calculate("two + 2").unwrap_err().contains("unexpected"));
        assert!(calculate("").unwrap_err().contains("ended early"));
        assert!(calculate(&"(".repeat(500)).unwrap_err().contains("nests deeper"));
        assert!(calculate(&"-".repeat(900)).unwrap_err().contains("nests deeper"));
        assert!(calculate(&"1+".repeat(600)).unwrap_err().contains("longer than"));
    }
}
