//! `agentry chat`: the terminal client of seed 002 over the HTTP API. It streams tokens as
//! they arrive, shows tool calls and results, asks to allow or deny approvals and to
//! answer `ask_user_question`, follows sub-agent threads, and continues the conversation
//! across turns. A session left waiting for answers is asked again first; a turn that
//! fails is reported and the chat goes on; Ctrl-C cancels a reply, and a second one (or
//! one while a request waits) leaves at once. What models and tools send is shown with
//! control characters escaped.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use anyhow::{Result, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Stdin};

use crate::client::Api;

/// Reads the user's lines.
pub struct Terminal {
    input: BufReader<Stdin>,
}

impl Terminal {
    pub fn new() -> Self {
        Self { input: BufReader::new(tokio::io::stdin()) }
    }

    /// Prints `prompt` and reads one line (bytes that are not UTF-8 become U+FFFD rather
    /// than ending the chat); `None` at end of input or on Ctrl-C.
    async fn ask(&mut self, prompt: &str) -> Result<Option<String>> {
        write!(std::io::stdout(), "{prompt}")?;
        std::io::stdout().flush()?;
        let mut line = Vec::new();
        tokio::select! {
            read = self.input.read_until(b'\n', &mut line) => {
                if read? == 0 {
                    return Ok(None);
                }
                Ok(Some(String::from_utf8_lossy(&line).trim().to_owned()))
            }
            _ = tokio::signal::ctrl_c() => {
                writeln!(std::io::stdout())?;
                Ok(None)
            }
        }
    }

    /// Asks until the answer is one `accept` takes; `None` at end of input.
    /// Asks until the answer is one `accept` takes, saying `expected` after one it does
    /// not; `None` at end of input.
    async fn ask_until<T>(
        &mut self,
        prompt: &str,
        expected: &str,
        accept: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>> {
        loop {
            let Some(line) = self.ask(prompt).await? else { return Ok(None) };
            if let Some(answer) = accept(&line) {
                return Ok(Some(answer));
            }
            writeln!(std::io::stdout(), "({expected})")?;
        }
    }
}

/// What a tool call was, for showing it and for prompts.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    arguments: String,
}

impl Call {
    /// A tool call of a `model.message` (its id, and the call).
    fn of(call: &Value) -> (String, Self) {
        let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
        let (name, arguments) = (text(&call["function"]["name"]), text(&call["function"]["arguments"]));
        (text(&call["id"]), Self { name, arguments })
    }
}

/// What the chat has seen of its session: tool calls by id, and the agents of sub-agent
/// threads by thread id (a member paused in one turn goes on in the next).
#[derive(Debug, Default)]
struct Known {
    calls: HashMap<String, Call>,
    threads: HashMap<String, String>,
}

/// What a finished turn asks for.
#[derive(Debug, Default)]
struct Pending {
    approvals: Vec<(String, String)>,
    responses: Vec<(String, String)>,
    /// MCP servers to authorize (name, URL): the next turn, with no input, goes on.
    authorizations: Vec<(String, String)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.approvals.is_empty() && self.responses.is_empty() && self.authorizations.is_empty()
    }
}

/// Runs the chat until the input ends or the user types `/quit`.
pub async fn run(api: &Api, agent: &str, session: Option<String>) -> Result<()> {
    let session_id = match session {
        // A UUID, as the argument's parser checked.
        Some(id) => {
            let found = api.get(&format!("/v1/agents/sessions/{id}")).await?;
            let owner = found["data"]["agent_name"].as_str().unwrap_or_default();
            if owner != agent {
                bail!(
                    "session {id} belongs to agent {owner:?}, not {agent:?}: chat with `agentry chat {owner} --session {id}`"
                );
            }
            id
        }
        None => {
            let created = api.post("/v1/agents/sessions", &json!({"agent_name": agent})).await?;
            created["data"]["id"].as_str().unwrap_or_default().to_owned()
        }
    };
    writeln!(std::io::stdout(), "Chatting with {agent} in session {session_id}. Type /quit to leave.")?;
    let mut terminal = Terminal::new();
    let mut known = Known::default();
    // A session whose last turn waits for answers (left that way by an earlier chat) is
    // answered first: a message would be refused until then.
    let mut pending =
        until_interrupted(waiting(api, &session_id, &mut known), "while reading the session").await?;
    loop {
        let input = if pending.is_empty() {
            let Some(line) = terminal.ask("you> ").await? else { break };
            if line.is_empty() {
                continue;
            }
            if line == "/quit" {
                break;
            }
            vec![json!({"type": "user.message", "content": line})]
        } else {
            if !pending.authorizations.is_empty() {
                // Authorizing happens elsewhere; the turn then goes on.
                for (name, url) in &pending.authorizations {
                    writeln!(std::io::stdout(), "Authorize MCP server {}: {}", clean(name), clean(url))?;
                }
                if terminal.ask("Press Enter once authorized: ").await?.is_none() {
                    bail!(
                        "left with the turn waiting for an authorization; go on with `agentry chat {agent} --session {session_id}`"
                    );
                }
            }
            // With no input after an authorization alone; with the answers the turn also
            // waits for otherwise (a turn without them is refused).
            if pending.approvals.is_empty() && pending.responses.is_empty() {
                Vec::new()
            } else {
                let input = answer(&mut terminal, &pending, &known.calls).await?;
                if input.is_empty() {
                    bail!(
                        "left with the turn waiting for an answer; answer it with `agentry chat {agent} --session {session_id}`"
                    );
                }
                input
            }
        };
        // A turn that could not run (too large, refused, the server unreachable) is
        // reported, and the chat goes on.
        pending = match run_turn(api, &session_id, &input, &mut known).await {
            Ok(pending) => pending,
            Err(error) => {
                writeln!(std::io::stdout(), "error: {}", clean(&format!("{error:#}")))?;
                until_interrupted(waiting(api, &session_id, &mut known), "while reading the session")
                    .await
                    .unwrap_or_default()
            }
        };
    }
    Ok(())
}

/// What the session's latest turn waits for, with the calls it names and the threads they
/// are on: its answer's own calls, and a member's from the turn's stored events.
async fn waiting(api: &Api, session: &str, known: &mut Known) -> Result<Pending> {
    let turns = api.get(&format!("/v1/agents/sessions/{session}/turns?limit=1")).await?;
    let turn = &turns["data"][0];
    let state = &turn["state"];
    for call in state["output"]["tool_calls"].as_array().into_iter().flatten() {
        let (id, call) = Call::of(call);
        known.calls.insert(id, call);
    }
    let pending =
        pending_in(state, |id| writeln!(std::io::stdout(), "{}", may_have_run(id)).map_err(Into::into))?;
    let asked = pending.approvals.iter().chain(&pending.responses);
    let calls: HashSet<String> =
        asked.clone().map(|(_, id)| id).filter(|id| !known.calls.contains_key(*id)).cloned().collect();
    let threads: HashSet<String> = asked
        .map(|(thread, _)| thread)
        .filter(|thread| *thread != "main" && !known.threads.contains_key(*thread))
        .cloned()
        .collect();
    if let Some(turn) = turn["id"].as_str().filter(|_| !calls.is_empty() || !threads.is_empty()) {
        let path = format!("/v1/agents/sessions/{session}/turns/{turn}/events");
        look_up(api, &path, &calls, &threads, known).await;
    }
    Ok(pending)
}

/// What a turn's state waits for (its required actions); `may_have_run` is told each call
/// a dead process may already have run.
fn pending_in(state: &Value, mut may_have_run: impl FnMut(&str) -> Result<()>) -> Result<Pending> {
    let mut pending = Pending::default();
    for action in state["required_actions"].as_array().into_iter().flatten() {
        let thread = action["thread_id"].as_str().unwrap_or("main").to_owned();
        let list = match action["type"].as_str() {
            Some("tool.approval_required") => &mut pending.approvals,
            Some("tool.response_required") => &mut pending.responses,
            Some("mcp.auth_required") => {
                for server in action["mcp_servers"].as_array().into_iter().flatten() {
                    let name = server["name"].as_str().unwrap_or_default().to_owned();
                    pending
                        .authorizations
                        .push((name, server["auth_url"].as_str().unwrap_or_default().to_owned()));
                }
                continue;
            }
            _ => continue,
        };
        for call in action["tool_calls"].as_array().into_iter().flatten() {
            let id = call["id"].as_str().unwrap_or_default().to_owned();
            if call["may_have_run"].as_bool() == Some(true) {
                may_have_run(&id)?;
            }
            list.push((thread.clone(), id));
        }
    }
    Ok(pending)
}

/// Adds to `known` the `calls` (by id) that the `model.message` events of a turn's stored
/// events (at `path`) made and the agents of the `threads` its `thread.created` events
/// started, read newest first until each is found. One not found there (a thread started,
/// or a call made, in an earlier turn) or not readable is shown by its id.
async fn look_up(
    api: &Api,
    path: &str,
    calls: &HashSet<String>,
    threads: &HashSet<String>,
    known: &mut Known,
) {
    /// Pages read at most: what a turn waits for is among its last events.
    const MAX_PAGES: usize = 40;
    let mut found = Known::default();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = match &token {
            Some(token) => api.get(&format!("{path}?order=desc&limit=25&page_token={token}")).await,
            None => api.get(&format!("{path}?order=desc&limit=25")).await,
        };
        let Ok(page) = page else { break };
        for event in page["data"].as_array().into_iter().flatten() {
            match event["type"].as_str() {
                Some("model.message") => {
                    for call in event["tool_calls"].as_array().into_iter().flatten() {
                        let (id, call) = Call::of(call);
                        if calls.contains(&id) {
                            found.calls.insert(id, call);
                        }
                    }
                }
                Some("thread.created") => {
                    let thread = event["thread_id"].as_str().unwrap_or_default();
                    if let (true, Some(name)) =
                        (threads.contains(thread), event["agent_info"]["name"].as_str())
                    {
                        found.threads.insert(thread.to_owned(), name.to_owned());
                    }
                }
                _ => {}
            }
        }
        token = page["pagination"]["next_page_token"].as_str().map(str::to_owned);
        if (found.calls.len() == calls.len() && found.threads.len() == threads.len()) || token.is_none() {
            break;
        }
    }
    known.calls.extend(found.calls);
    known.threads.extend(found.threads);
}

/// `text` with control characters (other than line breaks and tabs) shown as escapes:
/// what a model or a tool sends must not drive the terminal.
fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// Where the terminal is: mid-line in one thread's text, or at the start of a line.
#[derive(Debug, Default)]
struct Screen {
    /// The thread whose text the current line holds.
    printing: Option<String>,
}

impl Screen {
    /// Ends a half-printed line.
    fn end_line(&mut self, out: &mut impl Write) -> Result<()> {
        if self.printing.take().is_some() {
            writeln!(out)?;
        }
        Ok(())
    }

    /// Prints a whole line (after ending a half-printed one).
    fn line(&mut self, out: &mut impl Write, text: &str) -> Result<()> {
        self.end_line(out)?;
        writeln!(out, "{}", clean(text))?;
        Ok(())
    }

    /// Prints streamed text of `thread`, starting a labelled line when another thread
    /// held the current one.
    fn text(&mut self, out: &mut impl Write, thread: &str, label: &str, text: &str) -> Result<()> {
        if self.printing.as_deref() != Some(thread) {
            self.end_line(out)?;
            write!(out, "{label} ")?;
            self.printing = Some(thread.to_owned());
        }
        write!(out, "{}", clean(text))?;
        out.flush()?;
        Ok(())
    }
}

/// Streams one turn, printing as it goes; returns what it waits for. A stream that ends
/// before `turn.done` (the server restarted, the connection broke) is resumed from the
/// last event received.
async fn run_turn(api: &Api, session: &str, input: &[Value], known: &mut Known) -> Result<Pending> {
    let body = json!({"input": input, "previous_turn_id": "auto", "stream": true});
    let turns = format!("/v1/agents/sessions/{session}/turns");
    let opening = api.stream(&turns, Some(&body), None);
    let mut events =
        until_interrupted(opening, "before the turn's stream opened (the turn may have started)").await?;
    let mut pending = Pending::default();
    let Known { calls, threads } = known;
    // Per thread, the message whose deltas are being printed (until its `model.message`):
    // its id and the text shown so far.
    let mut partial: HashMap<String, (String, String)> = HashMap::new();
    let mut screen = Screen::default();
    let mut out = std::io::stdout();
    let mut turn_id: Option<String> = None;
    let mut last_id: Option<String> = None;
    let mut resumes = 0;
    let mut cancelled = false;
    // One listener for the whole turn: a second Ctrl-C that comes while the first is being
    // handled is kept for the next round, not lost between two listeners.
    let mut interrupts = Interrupts::new()?;
    loop {
        let next = tokio::select! {
            next = events.next() => next,
            () = interrupts.next() => {
                // Ctrl-C while the agent works cancels the turn (its stream ends with
                // turn.done); a second one leaves at once.
                if cancelled {
                    screen.end_line(&mut out)?;
                    std::process::exit(130);
                }
                cancelled = true;
                screen.line(&mut out, "(cancelling…)")?;
                // Asked in the background: the stream (and a second Ctrl-C) are still
                // heard while a slow or unreachable server takes its time to answer.
                let (api, path) = (api.clone(), format!("/v1/agents/sessions/{session}/cancel"));
                tokio::spawn(async move {
                    if let Err(error) = api.post(&path, &json!({})).await {
                        eprintln!("the cancellation was not sent: {error:#}");
                    }
                });
                continue;
            }
        };
        let event = match next {
            Some(Ok(event)) => event,
            broken => {
                // The stream broke or ended without `turn.done` (the server restarted, the
                // connection dropped): resume it after the last event received.
                let Some(turn) = &turn_id else {
                    return Err(broken.and_then(Result::err).unwrap_or_else(|| {
                        anyhow::anyhow!("the server closed the stream before the turn started")
                    }));
                };
                resumes += 1;
                if resumes > 5 {
                    bail!("the turn's stream keeps breaking; see `agentry events {turn} --follow`");
                }
                let path = format!("/v1/agents/sessions/{session}/turns/{turn}/subscribe");
                events = match until_interrupted(api.resume(&path, last_id.as_deref()), "while reconnecting")
                    .await
                {
                    Ok(events) => events,
                    Err(error) => {
                        screen.end_line(&mut out)?;
                        // The turn is stored and goes on when a server runs on the store
                        // again: say where to follow it.
                        return Err(error.context(format!(
                            "the turn's stream could not be resumed (the turn is kept, and goes on once a \
                             server runs again): follow it with `agentry events {turn} --follow`"
                        )));
                    }
                };
                continue;
            }
        };
        last_id = event.id.or(last_id);
        let event = event.data;
        let thread = event["thread_id"].as_str().unwrap_or("main").to_owned();
        let who = threads.get(&thread).map(|name| format!("[{name}] ")).unwrap_or_default();
        match event["type"].as_str().unwrap_or_default() {
            "turn.created" => turn_id = event["turn_id"].as_str().map(str::to_owned),
            "model.message.delta" => {
                let Some(text) = event["content"].as_str().filter(|text| !text.is_empty()) else { continue };
                let id = event["id"].as_str().unwrap_or_default();
                let label =
                    threads.get(&thread).map_or_else(|| "agent>".to_owned(), |name| format!("[{name}]"));
                show(&mut screen, &mut out, &mut partial, (&thread, &label, &who), id, text)?;
            }
            "model.message" => {
                // Text the deltas did not show: the stream resumed past deltas that were
                // never stored (the turn ended while the connection was down).
                let id = event["id"].as_str().unwrap_or_default();
                let content = event["content"].as_str().unwrap_or_default();
                let shown =
                    partial.get(&thread).filter(|(open, _)| open == id).map(|(_, shown)| shown.as_str());
                let rest = match shown {
                    Some(shown) => content.strip_prefix(shown).unwrap_or_default(),
                    None => content,
                };
                if !rest.is_empty() {
                    let label =
                        threads.get(&thread).map_or_else(|| "agent>".to_owned(), |name| format!("[{name}]"));
                    show(&mut screen, &mut out, &mut partial, (&thread, &label, &who), id, rest)?;
                }
                partial.remove(&thread);
                screen.end_line(&mut out)?;
                for call in event["tool_calls"].as_array().into_iter().flatten() {
                    let (id, call) = Call::of(call);
                    screen.line(&mut out, &format!("{who}→ {}({})", call.name, call.arguments))?;
                    calls.insert(id, call);
                }
            }
            "tool.response" => {
                screen
                    .line(&mut out, &format!("{who}← {}", event["content"].as_str().unwrap_or_default()))?;
            }
            "thread.created" => {
                let name = event["agent_info"]["name"].as_str().unwrap_or("sub-agent").to_owned();
                screen.line(&mut out, &format!("[{name}] started on thread {thread}"))?;
                threads.insert(thread, name);
            }
            "thread.done" => {
                let status = event["state"]["status"].as_str().unwrap_or("done");
                screen.line(
                    &mut out,
                    &format!("{}{status}", if who.is_empty() { format!("[{thread}] ") } else { who }),
                )?;
            }
            "tool.approval_required" => {
                for call in event["tool_calls"].as_array().into_iter().flatten() {
                    if call["may_have_run"].as_bool() == Some(true) {
                        screen.line(&mut out, &may_have_run(call["id"].as_str().unwrap_or_default()))?;
                    }
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
                    let name = server["name"].as_str().unwrap_or_default().to_owned();
                    let url = server["auth_url"].as_str().unwrap_or_default().to_owned();
                    screen.line(&mut out, &format!("MCP server {name} needs authorization: {url}"))?;
                    pending.authorizations.push((name, url));
                }
            }
            "turn.done" => {
                screen.end_line(&mut out)?;
                let state = &event["state"];
                // What the turn ended waiting for, and nothing else: a request a member
                // streamed is gone from a turn that was cancelled, failed or answered.
                pending = pending_in(state, |_| Ok(()))?;
                match state["status"].as_str() {
                    Some("cancelled") => screen.line(
                        &mut out,
                        &format!("(turn cancelled: {})", state["reason"].as_str().unwrap_or("cancelled")),
                    )?,
                    Some("error") => screen.line(
                        &mut out,
                        &format!("(turn failed: {})", state["message"].as_str().unwrap_or("error")),
                    )?,
                    _ => {}
                }
                break;
            }
            _ => {}
        }
    }
    out.flush()?;
    Ok(pending)
}

/// The note for a call a stopped process may already have run.
fn may_have_run(id: &str) -> String {
    format!("Call {} may already have run: its process stopped before its result was stored.", clean(id))
}

/// Ctrl-C presses, heard by one listener for as long as it lives (`tokio::signal::ctrl_c`
/// hears only those after each call, so presses between two calls would be lost).
struct Interrupts {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> Result<Self> {
        #[cfg(unix)]
        let interrupts =
            Self { signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())? };
        #[cfg(not(unix))]
        let interrupts = Self {};
        Ok(interrupts)
    }

    /// The next press.
    async fn next(&mut self) {
        #[cfg(unix)]
        self.signal.recv().await;
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Waits for `work`; Ctrl-C meanwhile leaves the chat at once (exit 130), saying `when`.
async fn until_interrupted<T>(work: impl std::future::Future<Output = Result<T>>, when: &str) -> Result<T> {
    tokio::select! {
        done = work => done,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted {when}");
            std::process::exit(130);
        }
    }
}

/// Prints streamed `text` of message `id` on a thread (`place`: the thread, its label and
/// its prefix for notes). Text of another message before the first one's `model.message`
/// means the server stopped mid-answer and the process that resumed the turn answers
/// again from the start: a note says so.
fn show(
    screen: &mut Screen,
    out: &mut impl Write,
    partial: &mut HashMap<String, (String, String)>,
    (thread, label, who): (&str, &str, &str),
    id: &str,
    text: &str,
) -> Result<()> {
    if partial.get(thread).is_some_and(|(open, shown)| open != id && !shown.is_empty()) {
        screen.line(out, &format!("{who}(interrupted: the server stopped mid-answer; it answers again)"))?;
        partial.remove(thread);
    }
    let (_, shown) = partial.entry(thread.to_owned()).or_insert_with(|| (id.to_owned(), String::new()));
    shown.push_str(text);
    screen.text(out, thread, label, text)
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
        let yes_or_no = |reply: &str| match reply.to_ascii_lowercase().as_str() {
            "y" | "yes" => Some(true),
            "n" | "no" => Some(false),
            _ => None,
        };
        let prompt = clean(&format!("Allow {}({})? [y/n] ", call.name, call.arguments)).into_owned();
        let Some(allowed) = terminal.ask_until(&prompt, "answer y or n", yes_or_no).await? else {
            return Ok(Vec::new());
        };
        if allowed {
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
        writeln!(std::io::stdout(), "? {}", clean(question))?;
        let options: Vec<&str> =
            arguments["options"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        for (number, option) in options.iter().enumerate() {
            writeln!(std::io::stdout(), "  {}. {}", number + 1, clean(option))?;
        }
        // A number picks an option; any other text is the answer itself.
        let pick = |reply: &str| match reply.parse::<usize>() {
            Ok(number) if !options.is_empty() => {
                options.get(number.wrapping_sub(1)).map(|option| (*option).to_owned())
            }
            _ if reply.is_empty() => None,
            _ => Some(reply.to_owned()),
        };
        let expected = if options.is_empty() {
            "type an answer".to_owned()
        } else {
            format!("choose 1 to {}, or type an answer", options.len())
        };
        let Some(answer) = terminal.ask_until("answer> ", &expected, pick).await? else {
            return Ok(Vec::new());
        };
        input.push(
            json!({"type": "user.tool_response", "thread_id": thread, "tool_call_id": id, "content": answer}),
        );
    }
    if input.is_empty() {
        bail!("the turn waits for something this client cannot answer");
    }
    Ok(input)
}
