//! Tasks mode: the coordinator's task list and its tools. Each session has one list per
//! tasks-mode team, kept in process memory (the latest 1,024 sessions') and written through
//! to the session's state (`agentry.tasks.<team name>`, so a tasks team inside another keeps
//! its own), from which each turn reads it again when it first uses it: the turn
//! before may have run in another process, or this process's last saves may have been
//! refused (its turn was taken over). Every task a member runs is a sub-agent thread with a
//! stored member run; a task whose member paused for a person pauses the team turn and
//! resumes with the next turn's answers, and a finished task gives its result again
//! without running.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use agentry_runner::{FunctionTool, Tool, ToolContext, ToolError};
use agentry_types::SessionId;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Crew, run_member, title};

/// How many sessions' task lists are kept in memory.
const KEPT_TURNS: usize = 1024;

/// The session-state key of a team's task list: this, a dot and the team's name.
const STATE_KEY_PREFIX: &str = "agentry.tasks";

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    Running,
    /// Its member waits for a person or the client.
    Paused,
    Done,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Task {
    id: String,
    title: String,
    description: String,
    assignee: String,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
}

#[derive(Debug, Default)]
struct Lists {
    by_turn: HashMap<SessionId, Vec<Task>>,
    order: VecDeque<SessionId>,
    /// Sessions whose list a running turn uses (read from the store once in the turn, and
    /// not again): never dropped to make room, or the turn would go on with an empty list
    /// and save it over the stored one.
    pinned: HashMap<SessionId, usize>,
}

/// A running turn's hold on its session's list (see [`Lists::pinned`]), let go when the
/// turn ends (with its turn locals).
struct Pin {
    lists: Arc<Mutex<Lists>>,
    session: SessionId,
}

impl Pin {
    fn new(lists: &Arc<Mutex<Lists>>, session: SessionId) -> Self {
        *lists.lock().unwrap_or_else(PoisonError::into_inner).pinned.entry(session).or_default() += 1;
        Self { lists: lists.clone(), session }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut lists = self.lists.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = lists.pinned.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                lists.pinned.remove(&self.session);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Board {
    /// The team whose list it is.
    team: Arc<str>,
    /// The session-state key its list is stored under.
    key: Arc<str>,
    lists: Arc<Mutex<Lists>>,
    /// Saves run one at a time, each writing the list as it is when it starts: the last
    /// save stored holds every change made before it.
    saving: Arc<tokio::sync::Mutex<()>>,
}

/// Per board (by the address of its lists), whether the turn has read its list from the
/// store: set once a read finishes, and awaited by the turn's other calls meanwhile, so
/// that none of them changes the list before it is read.
#[derive(Default)]
struct BoardsLoaded(Mutex<HashMap<usize, (Loaded, Pin)>>);

/// Settled once a turn's read of a board's list finished.
type Loaded = Arc<tokio::sync::OnceCell<()>>;

impl Board {
    fn new(team: &str) -> Self {
        Self {
            team: Arc::from(team),
            key: Arc::from(format!("{STATE_KEY_PREFIX}.{team}")),
            lists: Arc::default(),
            saving: Arc::default(),
        }
    }

    fn with<T>(&self, turn: SessionId, change: impl FnOnce(&mut Vec<Task>) -> T) -> T {
        let mut lists = self.lists.lock().unwrap_or_else(PoisonError::into_inner);
        if !lists.by_turn.contains_key(&turn) {
            lists.order.push_back(turn);
            // The oldest list no running turn uses makes room (with every one in use, the
            // bound waits until one is let go).
            if lists.order.len() > KEPT_TURNS
                && let Some(at) = lists.order.iter().position(|kept| !lists.pinned.contains_key(kept))
                && let Some(oldest) = lists.order.remove(at)
            {
                lists.by_turn.remove(&oldest);
            }
        }
        change(lists.by_turn.entry(turn).or_default())
    }

    /// Marks a task running and returns it (a finished task is returned as it is), or says
    /// why it cannot run.
    fn start(&self, turn: SessionId, id: &str) -> Result<Task, ToolError> {
        self.with(turn, |tasks| {
            let task = tasks
                .iter_mut()
                .find(|task| task.id == id)
                .ok_or_else(|| ToolError::Failed(format!("there is no task {id:?}; create it first")))?;
            match task.status {
                Status::Running => Err(ToolError::Failed(format!("task {id} is already running"))),
                Status::Done => Ok(task.clone()),
                Status::Pending | Status::Paused | Status::Failed => {
                    task.status = Status::Running;
                    Ok(task.clone())
                }
            }
        })
    }

    /// The list of a session, read from its state by the first call of each turn that uses
    /// it (outside a turn: when this process does not have it). The stored list replaces
    /// the one in memory, its running tasks made pending again: no call of this turn runs
    /// them yet, and a task stored as running was left so by a process that stopped (or
    /// whose turn was taken over) before it could save how the task ended. When the list
    /// cannot be read, the one in memory stays in use for the turn.
    async fn load(&self, context: &ToolContext) {
        let Some(loaded) = context.turn_local::<BoardsLoaded>() else {
            let known = self
                .lists
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .by_turn
                .contains_key(&context.session_id);
            if !known {
                self.read_stored(context).await;
            }
            return;
        };
        let board = Arc::as_ptr(&self.lists) as usize;
        let once = loaded
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(board)
            .or_insert_with(|| (Arc::default(), Pin::new(&self.lists, context.session_id)))
            .0
            .clone();
        // Settled by the first read that finishes, even unsuccessfully: a later read must
        // not replace a list the turn's calls have already worked on (a task one of them
        // started would be pending again). A read dropped with its call settles nothing.
        once.get_or_init(|| self.read_stored(context)).await;
    }

    /// Replaces the session's list in memory with the stored one; when it cannot be read,
    /// leaves the one in memory (and says so in the log).
    async fn read_stored(&self, context: &ToolContext) {
        let Some(store) = context.store() else { return };
        let session = match store.get_session(context.session_id).await {
            Ok(session) => session,
            Err(error) => {
                tracing::warn!(%error, "reading the stored task list failed; the one in memory stays in use");
                return;
            }
        };
        // Stored before lists had a key per team: under the bare prefix, by the session's
        // own team.
        let stored = session.state.get(self.key.as_ref()).or_else(|| {
            (session.name == self.team.as_ref()).then(|| session.state.get(STATE_KEY_PREFIX)).flatten()
        });
        let mut tasks = match stored.map(Vec::<Task>::deserialize) {
            None => Vec::new(),
            Some(Ok(tasks)) => tasks,
            Some(Err(error)) => {
                tracing::warn!(%error, "the stored task list does not read; the one in memory stays in use");
                return;
            }
        };
        for task in &mut tasks {
            if task.status == Status::Running {
                task.status = Status::Pending;
            }
        }
        self.with(context.session_id, |list| *list = tasks);
    }

    /// Writes the session's list through to its state (best effort: the list in memory is
    /// the one in use). Only the list's key is written, so other keys of the state are left
    /// as they are, and under the turn's fence: a process whose turn was taken over cannot
    /// overwrite the list of the process that now runs it.
    async fn save(&self, context: &ToolContext) {
        let Some(store) = context.store() else { return };
        let _saving = self.saving.lock().await;
        let tasks = self.with(context.session_id, |tasks| tasks.clone());
        let state = serde_json::Map::from_iter([(
            self.key.as_ref().to_owned(),
            serde_json::to_value(tasks).unwrap_or_default(),
        )]);
        let update = agentry_memory::SessionUpdate {
            state: Some(state),
            fence: context.fence(),
            ..agentry_memory::SessionUpdate::default()
        };
        if let Err(error) = store.update_session(context.session_id, &update).await {
            tracing::warn!(%error, "saving the task list failed");
        }
    }

    fn finish(&self, turn: SessionId, id: &str, outcome: &Result<String, ToolError>) {
        self.with(turn, |tasks| {
            if let Some(task) = tasks.iter_mut().find(|task| task.id == id) {
                match outcome {
                    Ok(answer) => {
                        task.status = Status::Done;
                        task.result = Some(answer.clone());
                    }
                    Err(ToolError::Paused { .. }) => task.status = Status::Paused,
                    Err(error) => {
                        task.status = Status::Failed;
                        task.result = Some(error.to_string());
                    }
                }
            }
        });
    }
}

#[derive(Deserialize, JsonSchema)]
struct CreateTask {
    /// A short title.
    title: String,
    /// What to do, self-contained: the member sees nothing else.
    description: String,
    /// The member who does it.
    assignee: String,
}

#[derive(Deserialize, JsonSchema)]
struct TaskRef {
    /// The task's id (`task-1`, …).
    task_id: String,
}

#[derive(Deserialize, JsonSchema)]
struct TaskRefs {
    /// The ids of independent tasks to run at once.
    task_ids: Vec<String>,
}

#[derive(Deserialize, JsonSchema)]
struct CompleteTask {
    /// The task's id.
    task_id: String,
    /// Its result, when the coordinator did it itself.
    #[serde(default)]
    result: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

async fn run_one(
    board: &Board,
    members: &Crew,
    context: &ToolContext,
    id: &str,
) -> Result<String, ToolError> {
    board.load(context).await;
    let task = board.start(context.session_id, id)?;
    if task.status == Status::Done {
        return Ok(task.result.unwrap_or_default());
    }
    let outcome = match members.find(&task.assignee) {
        Ok(member) => {
            run_member(members, context, member, task.description.clone(), title(member.name(), &task.title))
                .await
                .map(|result| result.answer)
        }
        Err(error) => Err(error),
    };
    board.finish(context.session_id, id, &outcome);
    board.save(context).await;
    outcome
}

/// The task-list tools of team `team`, over its board.
pub(crate) fn tools(team: &str, members: Arc<Crew>) -> Vec<Arc<dyn Tool>> {
    let board = Board::new(team);
    let create = {
        let (board, members) = (board.clone(), members.clone());
        FunctionTool::new(
            "create_task",
            "Adds a task for a member to the task list.",
            move |args: CreateTask, context: ToolContext| {
                let (board, members) = (board.clone(), members.clone());
                async move {
                    members.find(&args.assignee)?;
                    board.load(&context).await;
                    let id = board.with(context.session_id, |tasks| {
                        let id = format!("task-{}", tasks.len() + 1);
                        tasks.push(Task {
                            id: id.clone(),
                            title: args.title,
                            description: args.description,
                            assignee: args.assignee,
                            status: Status::Pending,
                            result: None,
                        });
                        id
                    });
                    board.save(&context).await;
                    Ok(format!("created {id}"))
                }
            },
        )
    };
    let run = {
        let (board, members) = (board.clone(), members.clone());
        FunctionTool::new(
            "run_task",
            "Runs one task: its member works on it and the result is recorded.",
            move |args: TaskRef, context: ToolContext| {
                let (board, members) = (board.clone(), members.clone());
                async move { run_one(&board, &members, &context, &args.task_id).await }
            },
        )
        .ends_on_cancel()
        .resumes_threads()
    };
    let run_many = {
        let (board, members) = (board.clone(), members);
        FunctionTool::new(
            "run_tasks",
            "Runs independent tasks at once; returns each result.",
            move |args: TaskRefs, context: ToolContext| {
                let (board, members) = (board.clone(), members.clone());
                async move {
                    let runs = args.task_ids.iter().map(|id| {
                        let (board, members, context) = (&board, &members, &context);
                        async move { (id.clone(), run_one(board, members, context, id).await) }
                    });
                    crate::join_outcomes(futures_util::future::join_all(runs).await)
                }
            },
        )
        .ends_on_cancel()
        .resumes_threads()
    };
    let complete = {
        let board = board.clone();
        FunctionTool::new(
            "complete_task",
            "Marks a task done, with its result when the coordinator did it.",
            move |args: CompleteTask, context: ToolContext| {
                let board = board.clone();
                async move {
                    board.load(&context).await;
                    let done = board.with(context.session_id, |tasks| {
                        let task =
                            tasks.iter_mut().find(|task| task.id == args.task_id).ok_or_else(|| {
                                ToolError::Failed(format!("there is no task {:?}", args.task_id))
                            })?;
                        task.status = Status::Done;
                        if args.result.is_some() {
                            task.result = args.result;
                        }
                        Ok(format!("{} done", task.id))
                    });
                    board.save(&context).await;
                    done
                }
            },
        )
    };
    let list = FunctionTool::new(
        "list_tasks",
        "Lists the tasks with their status and results.",
        move |_: Nothing, context: ToolContext| {
            let board = board.clone();
            async move {
                board.load(&context).await;
                let tasks = board.with(context.session_id, |tasks| tasks.clone());
                serde_json::to_string(&tasks).map_err(|error| ToolError::Failed(error.to_string()))
            }
        },
    );
    vec![create.shared(), run.shared(), run_many.shared(), complete.shared(), list.shared()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str) -> Task {
        Task {
            id: id.to_owned(),
            title: id.to_owned(),
            description: String::new(),
            assignee: "worker".to_owned(),
            status: Status::Running,
            result: None,
        }
    }

    /// A list a running turn uses is kept however many other sessions' lists come after
    /// it; once the turn lets go, it is the first to make room.
    #[test]
    fn a_list_in_use_is_not_dropped_to_make_room() {
        let board = Board::new("team");
        let (used, idle) = (SessionId::new(), SessionId::new());
        board.with(used, |tasks| tasks.push(task("task-1")));
        board.with(idle, |tasks| tasks.push(task("task-1")));
        let pin = Pin::new(&board.lists, used);
        for _ in 0..KEPT_TURNS {
            board.with(SessionId::new(), |tasks| tasks.push(task("other")));
        }
        let kept = |session| board.lists.lock().unwrap().by_turn.contains_key(&session);
        assert!(kept(used), "the turn's list stays");
        assert!(!kept(idle), "an idle list made room");
        drop(pin);
        board.with(SessionId::new(), |tasks| tasks.push(task("other")));
        assert!(!kept(used), "let go, it is the oldest");
        assert!(board.lists.lock().unwrap().pinned.is_empty());
    }
}
