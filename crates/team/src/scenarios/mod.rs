//! The team's acceptance scenarios, end to end through the runtime with scripted models:
//! one free async function per scenario taking a fresh store, and
//! [`team_scenarios!`](crate::team_scenarios) to expand them into one named test each, so
//! every store backend runs the same suite.

// The suite asserts: a failing expectation is the result.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, clippy::too_many_lines)]

pub mod budgets;
pub mod coordinate;
pub mod modes;
pub mod policy;
pub mod spawn;

/// The tool results a model request carries, oldest first.
fn tool_results(request: &agentry_model::ModelRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .filter(|message| message.role == agentry_types::Role::Tool)
        .map(|message| message.text())
        .collect()
}

/// A runtime over the harness's store with `agent` registered, a session of it, and a first
/// turn with `message`.
async fn start(
    harness: &agentry_memory::conformance::Harness,
    agent: agentry_runner::Agent,
    message: &str,
) -> (agentry_runner::Runtime, agentry_runner::Session, agentry_runner::TurnHandle) {
    let runtime = agentry_runner::Runtime::new(harness.store.clone());
    let name = agent.name().to_owned();
    runtime.register(agent);
    let session = runtime.create_session(&name, None).await.unwrap();
    let turn = session.create_turn(agentry_runner::TurnRequest::message(message)).await.unwrap();
    (runtime, session, turn)
}

/// What each `agent_team.budget.exhausted` among `events` names as exhausted, in order.
fn exhausted_by(events: &[std::sync::Arc<agentry_events::EventEnvelope>]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.payload {
            agentry_events::EventPayload::BudgetExhausted { exhausted_by, .. } => Some(exhausted_by.clone()),
            _ => None,
        })
        .collect()
}

/// A member `clerk` that files a report with `file_report`, which needs approval, then
/// answers `Report filed.`.
fn gated_clerk() -> agentry_runner::Agent {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let file = agentry_runner::FunctionTool::new("file_report", "Files the report.", |_: Nothing, _| async {
        Ok::<_, agentry_runner::ToolError>("filed".to_owned())
    });
    let model = std::sync::Arc::new(agentry_model::ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            agentry_model::ScriptedResponse::tool_call("file_report", &serde_json::json!({}))
        } else {
            agentry_model::ScriptedResponse::text("Report filed.")
        }
    }));
    agentry_runner::Agent::builder("clerk", model)
        .tool(file.shared())
        .requires_approval("file_report")
        .build()
}

/// Expands every team scenario into a named `#[tokio::test]` over stores from `$factory`
/// (an async closure returning a fresh `agentry_memory::conformance::Harness`).
#[macro_export]
macro_rules! team_scenarios {
    ($factory:expr) => {
        $crate::team_scenarios!(@cases $factory; spawn::an_instance_may_spawn_in_turn_within_the_depth_limit,
            spawn::an_instance_spends_no_more_than_its_spawner_has_left,
            spawn::a_nested_team_counts_its_own_spawns,
            spawn::an_instance_left_by_a_handed_over_turn_ends_when_the_turn_resumes,
            spawn::a_team_turn_cancelled_while_no_process_runs_it_ends_cancelled_when_resumed,
            spawn::a_spawn_waiting_for_approval_when_its_process_stops_is_denied_on_resume,
            spawn::an_instance_limit_counts_the_instances_a_dead_process_started,
            modes::a_member_resumed_by_a_turn_that_is_handed_over_ends_with_it,
            modes::a_broadcast_retried_after_a_crash_does_not_run_the_member_that_answered,
            modes::a_retried_broadcast_whose_fresh_member_asks_pauses_for_it,
            coordinate::a_member_whose_model_panics_leaves_no_run_running,
            modes::a_task_whose_member_pauses_resumes_next_turn_from_the_stored_task_list,
            modes::two_paused_tasks_of_one_member_each_resume_with_their_own_task,
            policy::a_member_pausing_inside_a_parallel_delegation_resumes_without_rerunning_the_others,
            budgets::an_instance_stops_when_its_cost_or_its_time_runs_out,
            budgets::a_step_past_a_budget_exhausts_it_at_once_not_at_the_next_step,
            budgets::an_instance_out_of_time_is_stopped_in_the_middle_of_a_step,
            budgets::a_members_reservations_end_with_the_turns_lease,
            coordinate::a_team_session_is_read_through_the_team_session_view,
            policy::an_approval_asked_inside_a_member_is_answered_next_turn_and_both_finish,
            policy::an_approved_call_past_its_missions_budget_does_not_run,
            policy::a_denial_beside_an_approved_call_past_its_budget_is_kept,
            policy::a_member_paused_when_the_answering_turn_is_cancelled_ends_with_it,
            policy::a_member_paused_in_a_turn_then_cancelled_ends_with_it,
            policy::two_members_asking_with_the_same_call_id_each_get_their_own_answer,
            policy::a_member_asking_for_two_approvals_in_turn_resumes_each_time,
            policy::a_member_of_a_nested_team_paused_for_approval_resumes_in_place,
            coordinate::a_team_turn_renders_in_the_harness_agent_team_and_agno_vocabularies,
            policy::one_instance_is_cancelled_on_its_own_and_the_others_finish,
            policy::a_mission_is_cancelled_with_all_its_instances,
            budgets::ten_concurrent_members_stop_at_the_mission_limit_and_are_all_cancelled,
            budgets::a_member_refused_only_for_what_others_hold_stops_alone,
            budgets::a_member_whose_own_calls_do_not_fit_uses_the_mission_up,
            coordinate::two_members_called_in_one_message_run_concurrently_on_their_own_threads,
            coordinate::delegating_to_an_unknown_member_gives_the_coordinator_an_error_listing_the_members,
            coordinate::a_team_without_members_is_offered_no_delegation,
            coordinate::a_member_end_too_large_to_keep_with_its_task_still_ends_its_thread,
            coordinate::delegating_to_every_member_collects_each_answer_and_a_failed_member_is_reported,
            modes::route_mode_answers_with_the_chosen_members_own_message,
            modes::a_member_paused_beside_a_direct_answer_ends_with_the_turn,
            modes::broadcast_mode_gives_every_member_the_task_and_the_coordinator_synthesizes,
            modes::a_broadcast_resumed_after_an_approval_is_not_forced_to_broadcast_again,
            modes::tasks_mode_creates_runs_in_parallel_and_completes_a_task_list,
            modes::a_team_nested_in_a_team_nests_its_member_responses,
            modes::a_handed_over_turn_leaves_the_stored_task_list_to_its_next_holder,
            modes::each_turn_works_from_the_stored_task_list_whichever_process_ran_the_last,
            modes::a_task_left_running_by_a_handed_over_turn_runs_again_next_turn,
            modes::a_tasks_team_inside_a_tasks_team_keeps_its_own_task_list,
            modes::a_task_list_stored_under_the_earlier_key_is_read_by_the_sessions_team,
            policy::a_member_calling_a_tool_outside_its_capabilities_is_refused_and_nothing_happens,
            policy::cancelling_a_team_turn_cancels_every_running_member_with_instance_events,
            policy::a_finished_member_reports_its_instance_started_and_completed_with_the_mission,
            spawn::without_a_policy_every_spawn_is_denied_as_spawn_policy_missing,
            spawn::each_refusal_of_the_policy_has_its_own_code,
            spawn::a_granted_spawn_starts_an_instance_and_the_second_beyond_the_limit_is_denied,
            spawn::a_gated_spawn_waits_for_approval_and_is_approved_once_and_denied_once,
            spawn::an_undecided_gated_spawn_is_denied_when_its_wait_ends,
            spawn::an_invalid_policy_is_refused_with_the_problem_named);
    };
    (@cases $factory:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = ($factory)().await;
                $crate::scenarios::$module::$name(harness).await;
            }
        )*
    };
}
