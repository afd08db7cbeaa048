//! Turn input validation: every rule of the harness specification, each with its typed error.

use agentry_types::{
    ApprovalDecision, EventId, McpServerAuth, MessageContent, PendingActions, PendingToolCall,
    RequiredAction, RequiredActionRecord, ThreadId, Timestamp, TurnInputError, TurnInputItem, UserMessage,
    ValidatedInput, validate_turn_input,
};

fn call(id: &str) -> PendingToolCall {
    PendingToolCall {
        id: id.into(),
        source_event_id: EventId::new(),
        name: "tool".into(),
        arguments: "{}".into(),
        may_have_run: false,
    }
}

fn record(action: RequiredAction) -> RequiredActionRecord {
    RequiredActionRecord { id: EventId::new(), created_at: Timestamp::now(), action }
}

/// `email` awaits approval on main; `ask` awaits a client response on a sub-thread.
fn pending(sub: &ThreadId) -> PendingActions {
    PendingActions::from_required_actions(&[
        record(RequiredAction::ToolApproval { thread_id: ThreadId::main(), tool_calls: vec![call("email")] }),
        record(RequiredAction::ToolResponse { thread_id: sub.clone(), tool_calls: vec![call("ask")] }),
    ])
}

fn mcp_pending() -> PendingActions {
    PendingActions::from_required_actions(&[record(RequiredAction::McpAuth {
        thread_id: None,
        servers: vec![McpServerAuth { id: "s".into(), name: "mail".into(), auth_url: "https://a".into() }],
    })])
}

#[test]
fn a_user_message_starts_a_turn_when_nothing_is_pending() {
    let input = [TurnInputItem::message("hello"), TurnInputItem::message("and more")];
    let Ok(ValidatedInput::Messages(messages)) = validate_turn_input(&input, &PendingActions::none()) else {
        panic!("expected messages");
    };
    assert_eq!(messages.len(), 2);
}

#[test]
fn an_empty_input_with_nothing_pending_is_refused() {
    assert_eq!(validate_turn_input(&[], &PendingActions::none()), Err(TurnInputError::Empty));
}

#[test]
fn an_empty_or_blank_message_is_refused_with_its_position() {
    let input = [TurnInputItem::message("ok"), TurnInputItem::message("   ")];
    assert_eq!(
        validate_turn_input(&input, &PendingActions::none()),
        Err(TurnInputError::EmptyMessage { index: 1 })
    );
    let parts = [TurnInputItem::Message(UserMessage { content: MessageContent::Parts(Vec::new()) })];
    assert_eq!(
        validate_turn_input(&parts, &PendingActions::none()),
        Err(TurnInputError::EmptyMessage { index: 0 })
    );
}

#[test]
fn user_messages_cannot_be_mixed_with_tool_answers() {
    let sub = ThreadId::new_sub_thread();
    let input = [TurnInputItem::allow(ThreadId::main(), "email"), TurnInputItem::message("also this")];
    assert_eq!(validate_turn_input(&input, &pending(&sub)), Err(TurnInputError::MessageMixedWithToolInput));
    assert_eq!(
        validate_turn_input(&input, &PendingActions::none()),
        Err(TurnInputError::MessageMixedWithToolInput)
    );
}

#[test]
fn approvals_and_responses_may_be_mixed_and_must_answer_every_pending_call() {
    let sub = ThreadId::new_sub_thread();
    let input = [
        TurnInputItem::respond(sub.clone(), "ask", "formal"),
        TurnInputItem::deny(ThreadId::main(), "email", Some("not now".into())),
    ];
    let Ok(ValidatedInput::Resume { approvals, responses }) = validate_turn_input(&input, &pending(&sub))
    else {
        panic!("expected a resume");
    };
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].call.id, "email");
    assert_eq!(approvals[0].decision, ApprovalDecision::Deny { reason: Some("not now".into()) });
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].thread_id, sub);
    assert_eq!(responses[0].content, "formal");
}

#[test]
fn a_missing_answer_is_refused_naming_every_unanswered_call() {
    let sub = ThreadId::new_sub_thread();
    let input = [TurnInputItem::allow(ThreadId::main(), "email")];
    assert_eq!(
        validate_turn_input(&input, &pending(&sub)),
        Err(TurnInputError::MissingAnswers { tool_call_ids: vec!["ask".into()] })
    );
    assert_eq!(
        validate_turn_input(&[], &pending(&sub)),
        Err(TurnInputError::MissingAnswers { tool_call_ids: vec!["email".into(), "ask".into()] })
    );
}

#[test]
fn a_user_message_while_calls_are_pending_is_refused() {
    let sub = ThreadId::new_sub_thread();
    assert_eq!(
        validate_turn_input(&[TurnInputItem::message("hi")], &pending(&sub)),
        Err(TurnInputError::PendingToolCalls { pending: vec!["email".into(), "ask".into()] })
    );
}

#[test]
fn an_unknown_call_is_refused() {
    let sub = ThreadId::new_sub_thread();
    let input = [TurnInputItem::allow(ThreadId::main(), "nope")];
    assert_eq!(
        validate_turn_input(&input, &pending(&sub)),
        Err(TurnInputError::UnknownToolCall { index: 0, tool_call_id: "nope".into() })
    );
}

#[test]
fn a_call_answered_twice_is_refused() {
    let sub = ThreadId::new_sub_thread();
    let input = [
        TurnInputItem::allow(ThreadId::main(), "email"),
        TurnInputItem::respond(sub.clone(), "ask", "x"),
        TurnInputItem::deny(ThreadId::main(), "email", None),
    ];
    assert_eq!(
        validate_turn_input(&input, &pending(&sub)),
        Err(TurnInputError::DuplicateAnswer { index: 2, tool_call_id: "email".into() })
    );
}

#[test]
fn an_answer_on_the_wrong_thread_is_refused() {
    let sub = ThreadId::new_sub_thread();
    let input = [TurnInputItem::allow(sub.clone(), "email"), TurnInputItem::respond(sub.clone(), "ask", "x")];
    let Err(TurnInputError::WrongThread { index, tool_call_id, expected, .. }) =
        validate_turn_input(&input, &pending(&sub))
    else {
        panic!("expected WrongThread");
    };
    assert_eq!((index, tool_call_id.as_str(), expected.as_str()), (0, "email", "main"));
}

#[test]
fn an_approval_for_a_call_that_needs_a_response_is_refused() {
    let sub = ThreadId::new_sub_thread();
    let input = [TurnInputItem::allow(ThreadId::main(), "email"), TurnInputItem::allow(sub.clone(), "ask")];
    assert_eq!(
        validate_turn_input(&input, &pending(&sub)),
        Err(TurnInputError::WrongAnswerKind {
            index: 1,
            tool_call_id: "ask".into(),
            expected: "user.tool_response",
            given: "user.tool_approval",
        })
    );
}

#[test]
fn answers_with_nothing_pending_are_refused() {
    let input = [TurnInputItem::respond(ThreadId::main(), "ask", "x")];
    assert_eq!(
        validate_turn_input(&input, &PendingActions::none()),
        Err(TurnInputError::NothingPending { index: 0, tool_call_id: "ask".into() })
    );
}

#[test]
fn resuming_after_mcp_auth_takes_no_input() {
    assert_eq!(validate_turn_input(&[], &mcp_pending()), Ok(ValidatedInput::McpAuthorized));
    assert_eq!(
        validate_turn_input(&[TurnInputItem::message("hi")], &mcp_pending()),
        Err(TurnInputError::InputAfterMcpAuth)
    );
    assert_eq!(
        validate_turn_input(&[TurnInputItem::allow(ThreadId::main(), "x")], &mcp_pending()),
        Err(TurnInputError::InputAfterMcpAuth)
    );
}

#[test]
fn turn_input_reads_the_harness_wire_form_and_refuses_bad_data_uris() {
    let wire = r#"[
        {"type": "user.message", "content": [{"type": "text", "text": "see"},
            {"type": "file", "name": "a.txt", "data": "data:text/plain;base64,aGk="},
            {"type": "file_upload", "file": {"filename": "b.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}}]},
        {"type": "user.tool_approval", "thread_id": "main", "tool_call_id": "c", "approval": {"status": "deny", "reason": "no"}},
        {"type": "user.tool_response", "thread_id": "t1", "tool_call_id": "d", "content": "42"}
    ]"#;
    let items: Vec<TurnInputItem> = serde_json::from_str(wire).unwrap();
    let TurnInputItem::Message(UserMessage { content: MessageContent::Parts(parts) }) = &items[0] else {
        panic!("expected parts");
    };
    assert_eq!(parts.len(), 3);
    let again: Vec<TurnInputItem> = serde_json::from_value(serde_json::to_value(&items).unwrap()).unwrap();
    assert_eq!(again, items, "the documented file_upload form normalizes to the client's form");

    for (bad, why) in [
        (r#"{"type":"file","name":"x","data":"http://example.com/x"}"#, "data URI must start"),
        (r#"{"type":"file","name":"x","data":"data:text/plain,hello"}"#, "data:<mime>;base64"),
        (r#"{"type":"file","name":"x","data":"data:nomime;base64,aGk="}"#, "invalid MIME type"),
        (r#"{"type":"file","name":"x","data":"data:text/plain;base64,!!!"}"#, "not valid base64"),
        (r#"{"type":"file","name":"x","data":"data:text/plain;base64,"}"#, "payload is empty"),
        (r#"{"type":"file","data":"data:text/plain;base64,aGk="}"#, "missing field `name`"),
    ] {
        let error = serde_json::from_str::<agentry_types::ContentPart>(bad).unwrap_err().to_string();
        assert!(error.contains(why), "{bad}: {error}");
    }
}

#[test]
fn a_file_part_needs_a_name() {
    let part: agentry_types::ContentPart =
        serde_json::from_str(r#"{"type":"file","name":" ","data":"data:text/plain;base64,aGk="}"#).unwrap();
    let input = [TurnInputItem::Message(UserMessage {
        content: MessageContent::Parts(vec![agentry_types::ContentPart::Text { text: "x".into() }, part]),
    })];
    assert_eq!(
        validate_turn_input(&input, &PendingActions::none()),
        Err(TurnInputError::UnnamedFile { index: 0 })
    );
}

#[test]
fn an_image_part_needs_an_http_url_or_an_image_data_uri() {
    let image = |url: &str| {
        let part: agentry_types::ContentPart =
            serde_json::from_value(serde_json::json!({"type": "image_url", "image_url": {"url": url}}))
                .unwrap();
        [TurnInputItem::Message(UserMessage { content: MessageContent::Parts(vec![part]) })]
    };
    let none = PendingActions::none();
    assert!(validate_turn_input(&image("https://example.com/cat.png"), &none).is_ok());
    assert!(validate_turn_input(&image("data:image/png;base64,iVBORw0KGgo="), &none).is_ok());
    for (url, why) in [
        ("ftp://example.com/cat.png", "http(s)://"),
        ("data:text/plain;base64,aGk=", "not an image type"),
        ("data:image/png;base64,***", "not valid base64"),
    ] {
        let Err(TurnInputError::InvalidImageUrl { index: 0, reason }) =
            validate_turn_input(&image(url), &none)
        else {
            panic!("{url} should be refused");
        };
        assert!(reason.contains(why), "{url}: {reason}");
    }
}

/// Two members on models of their own may number their calls alike: a call is its thread
/// and its id, so each answer goes to its own thread, and none is taken for the other.
#[test]
fn calls_of_two_threads_with_one_id_are_answered_each_on_its_thread() {
    let (first, second) = (ThreadId::new_sub_thread(), ThreadId::new_sub_thread());
    let pending = PendingActions::from_required_actions(&[
        record(RequiredAction::ToolApproval { thread_id: first.clone(), tool_calls: vec![call("call_1_0")] }),
        record(RequiredAction::ToolApproval {
            thread_id: second.clone(),
            tool_calls: vec![call("call_1_0")],
        }),
    ]);
    let both = [
        TurnInputItem::allow(second.clone(), "call_1_0"),
        TurnInputItem::deny(first.clone(), "call_1_0", Some("no".to_owned())),
    ];
    let Ok(ValidatedInput::Resume { approvals, .. }) = validate_turn_input(&both, &pending) else {
        panic!("both answers are taken")
    };
    let decided: Vec<(ThreadId, bool)> = approvals
        .iter()
        .map(|approval| (approval.thread_id.clone(), approval.decision == ApprovalDecision::Allow))
        .collect();
    assert_eq!(decided, [(first.clone(), false), (second.clone(), true)]);
    // One answer leaves the other thread's call missing.
    let one = [TurnInputItem::allow(first.clone(), "call_1_0")];
    assert_eq!(
        validate_turn_input(&one, &pending),
        Err(TurnInputError::MissingAnswers { tool_call_ids: vec!["call_1_0".to_owned()] })
    );
    // The same thread twice is a duplicate, not an answer for the other.
    let twice = [TurnInputItem::allow(first.clone(), "call_1_0"), TurnInputItem::allow(first, "call_1_0")];
    assert!(matches!(
        validate_turn_input(&twice, &pending),
        Err(TurnInputError::DuplicateAnswer { index: 1, .. })
    ));
}
