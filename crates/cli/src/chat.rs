//! `agentry chat`: the terminal client of seed 002 over the HTTP API. It streams tokens as
//! they arrive, shows tool calls and results, asks to allow or deny approvals and to
//! answer `ask_user_question`, follows sub-agent threads, and continues the conversation
//! across turns.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Result, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::client::Api;

/// Reads the user's lines.
pub struct Terminal {
    lines: Lines<BufReader<Stdin>>,
}

impl Terminal {
    pub fn new() -> Self {
        Self { lines: BufReader::new(tokio::io::stdin()).lines() }
    }

    /// Prints `prompt` and reads one line; `None` at end of input.
    async fn ask(&mut self, prompt: &str) -> Result<Option<String>> {
        print!("{prompt}");
        std::io::stdout().flush()?;
        Ok(self.lines.next_line().await?.map(|line| line.trim().to_owned()))
    }
}

/// What a tool call was, for showing it and for prompts.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    arguments: String,
}

/// What a finished turn asks for.
#[derive(Debug, Default)]
struct Pending {
    approvals: Vec<(String, String)>,
    responses: Vec<(String, String)>,
}

/// Runs the chat until the input ends or the user types `/quit`.
pub async fn run(api: &Api, agent: &str, session: Option<String>) -> Result<()> {
    let session_id = match session {
        Some(id) => {
            api.get(&format!("/v1/agents/sessions/{id}")).await?;
            id
        }
        None => {
            let created = api.post("/v1/agents/sessions", &json!({"agent_name": agent})).await?;
            created["data"]["id"].as_str().unwrap_or_default().to_owned()
        }
    };
    println!("Chatting with {agent} in session {session_id}. Type /quit to leave.");
    let mut terminal = Terminal::new();
    let mut calls: HashMap<String, Call> = HashMap::new();
    loop {
        let Some(line) = terminal.ask("you> ").await? else { break };
        if line.is_empty() {
            continue;
        }
        if line == "/quit" {
            break;
        }
        let mut input = vec![json!({"type": "user.message", "content": line})];
        loop {
            let pending = run_turn(api, &session_id, &input, &mut calls).await?;
            if pending.approvals.is_empty() && pending.responses.is_empty() {
                break;
            }
            input = answer(&mut terminal, &pending, &calls).await?;
            if input.is_empty() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Streams one turn, printing as it goes; returns what it waits for.
async fn run_turn(
    api: &Api,
    session: &str,
    input: &[Value],
    calls: &mut HashMap<String, Call>,
) -> Result<Pending> {
    let body = json!({"input": input, "previous_turn_id": "auto", "stream": true});
    let mut events =
        Box::pin(api.stream(&format!("/v1/agents/sessions/{session}/turns"), Some(&body), None).await?);
    let mut pending = Pending::default();
    let mut threads: HashMap<String, String> = HashMap::new();
    let mut at_line_start = true;
    let mut out = std::io::stdout();
    // The thread whose text is being printed, so interleaved threads get their own lines.
    let mut printing: Option<String> = None;
    while let Some(event) = events.next().await {
        let event = event?.data;
        let thread = event["thread_id"].as_str().unwrap_or("main").to_owned();
        match event["type"].as_str().unwrap_or_default() {
            "model.message.delta" => {
                let Some(text) = event["content"].as_str().filter(|text| !text.is_empty()) else { continue };
                if printing.as_deref() != Some(thread.as_str()) {
                    if !at_line_start {
                        writeln!(out)?;
                    }
                    match threads.get(&thread) {
                        Some(name) => write!(out, "[{name}] ")?,
                        None => write!(out, "agent> ")?,
                    }
                    printing = Some(thread.clone());
                }
                write!(out, "{text}")?;
                at_line_start = text.ends_with('\n');
                out.flush()?;
            }
            "model.message" => {
                if !at_line_start {
                    writeln!(out)?;
                    at_line_start = true;
                }
                printing = None;
                for call in event["tool_calls"].as_array().into_iter().flatten() {
                    let id = call["id"].as_str().unwrap_or_default().to_owned();
                    let name = call["function"]["name"].as_str().unwrap_or_default().to_owned();
                    let arguments = call["function"]["arguments"].as_str().unwrap_or_default().to_owned();
                    let who = threads.get(&thread).map(|name| format!("[{name}] ")).unwrap_or_default();
                    writeln!(out, "{who}→ {name}({arguments})")?;
                    calls.insert(id, Call { name, arguments });
                }
            }
            "tool.response" => {
                let who = threads.get(&thread).map(|name| format!("[{name}] ")).unwrap_or_default();
                writeln!(out, "{who}← {}", event["content"].as_str().unwrap_or_default())?;
            }
            "thread.created" => {
                let name = event["agent_info"]["name"].as_str().unwrap_or("sub-agent").to_owned();
                writeln!(out, "[{name}] started on thread {thread}")?;
                threads.insert(thread, name);
            }
            "thread.done" => {
                let name = threads.get(&thread).cloned().unwrap_or_else(|| thread.clone());
                writeln!(out, "[{name}] {}", event["status"].as_str().unwrap_or("done"))?;
            }
            "tool.approval_required" => {
                for call in event["tool_calls"].as_array().into_iter().flatten() {
                    pending
                        .approvals
                        .push((thread.clone(), call["id"].as_str().unwrap_or_default().to_owned()));
                }
            }
            "tool.response_required" => {
                for call in event["tool_calls"].as_array().into_iter().flatten() {
                    pending
                        .responses
                        .push((thread.clone(), call["id"].as_str().unwrap_or_default().to_owned()));
                }
            }
            "mcp.auth_required" => {
                for server in event["mcp_servers"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "MCP server {} needs authorization: {}",
                        server["name"].as_str().unwrap_or_default(),
                        server["auth_url"].as_str().unwrap_or_default()
                    )?;
                }
            }
            "turn.done" => {
                let state = &event["state"];
                match state["status"].as_str() {
                    Some("cancelled") => writeln!(
                        out,
                        "(turn cancelled: {})",
                        state["cancellation_reason"].as_str().unwrap_or("cancelled")
                    )?,
                    Some("error") => {
                        writeln!(out, "(turn failed: {})", state["message"].as_str().unwrap_or("error"))?
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out.flush()?;
    Ok(pending)
}

/// Asks the user about every pending call; returns the next turn's input (empty when the
/// input ended).
async fn answer(
    terminal: &mut Terminal,
    pending: &Pending,
    calls: &HashMap<String, Call>,
) -> Result<Vec<Value>> {
    let mut input = Vec::new();
    for (thread, id) in &pending.approvals {
        let call =
            calls.get(id).cloned().unwrap_or(Call { name: "a tool".to_owned(), arguments: String::new() });
        let Some(reply) = terminal.ask(&format!("Allow {}({})? [y/n] ", call.name, call.arguments)).await?
        else {
            return Ok(Vec::new());
        };
        if reply.eq_ignore_ascii_case("y") || reply.eq_ignore_ascii_case("yes") {
            input.push(json!({"type": "user.tool_approval", "thread_id": thread, "tool_call_id": id,
                "approval": {"status": "allow"}}));
        } else {
            let Some(reason) = terminal.ask("Reason (optional): ").await? else { return Ok(Vec::new()) };
            let mut approval = json!({"status": "deny"});
            if !reason.is_empty() {
                approval["reason"] = json!(reason);
            }
            input.push(json!({"type": "user.tool_approval", "thread_id": thread, "tool_call_id": id,
                "approval": approval}));
        }
    }
    for (thread, id) in &pending.responses {
        let arguments: Value =
            calls.get(id).and_then(|call| serde_json::from_str(&call.arguments).ok()).unwrap_or_default();
        let question = arguments["question"].as_str().unwrap_or("The agent asks:");
        println!("? {question}");
        let options: Vec<&str> =
            arguments["options"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        for (number, option) in options.iter().enumerate() {
            println!("  {}. {option}", number + 1);
        }
        let Some(reply) = terminal.ask("answer> ").await? else { return Ok(Vec::new()) };
        let answer = reply
            .parse::<usize>()
            .ok()
            .and_then(|number| options.get(number.wrapping_sub(1)))
            .map_or(reply.clone(), |option| (*option).to_owned());
        input.push(
            json!({"type": "user.tool_response", "thread_id": thread, "tool_call_id": id, "content": answer}),
        );
    }
    if input.is_empty() {
        bail!("the turn waits for something this client cannot answer");
    }
    Ok(input)
}
