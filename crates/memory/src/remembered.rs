//! What a durable backend's writer thread remembers about running turns.

use std::collections::HashMap;

use agentry_types::{SessionId, TurnId};

/// What a writer knows about a turn without reading the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnFacts {
    /// The session the turn belongs to (fixed for the life of the run).
    pub session: SessionId,
    /// The last stored `seq` of the turn (0 when none).
    pub last_seq: u64,
}

/// The most turns remembered; past this the memory starts over.
const REMEMBERED_TURNS: usize = 4096;

/// A writer thread's memory of running turns, so that an event append reads nothing.
///
/// The backend keeps it true: it remembers a turn only as a successful write leaves it,
/// undoes what a refused write remembered ([`RememberedTurns::write_undone`]), and
/// forgets everything when another process may have written, a session was deleted, or a
/// transaction did not commit.
///
/// ```
/// use agentry_memory::{RememberedTurns, TurnFacts};
/// use agentry_types::{SessionId, TurnId};
///
/// let mut turns = RememberedTurns::default();
/// let (turn, session) = (TurnId::new(), SessionId::new());
/// turns.remember(turn, TurnFacts { session, last_seq: 3 });
/// turns.write_done();
/// // A write that is refused after it remembered something: its memory is undone.
/// turns.remember(turn, TurnFacts { session, last_seq: 5 });
/// turns.write_undone();
/// assert_eq!(turns.get(turn).unwrap().last_seq, 3);
/// turns.forget_all();
/// assert!(turns.get(turn).is_none());
/// ```
#[derive(Debug, Default)]
pub struct RememberedTurns {
    turns: HashMap<TurnId, TurnFacts>,
    /// What the current write changed, oldest first: each turn's facts before it.
    undo: Vec<(TurnId, Option<TurnFacts>)>,
}

impl RememberedTurns {
    /// What is remembered about a turn, if anything.
    #[must_use]
    pub fn get(&self, turn: TurnId) -> Option<TurnFacts> {
        self.turns.get(&turn).copied()
    }

    /// Remembers a turn's facts as they stand once the current write commits.
    pub fn remember(&mut self, turn: TurnId, facts: TurnFacts) {
        if self.turns.len() >= REMEMBERED_TURNS && !self.turns.contains_key(&turn) {
            self.turns.clear();
        }
        let before = self.turns.insert(turn, facts);
        self.undo.push((turn, before));
    }

    /// The current write stands (its transaction still has to commit: when it does not,
    /// the backend forgets everything).
    pub fn write_done(&mut self) {
        self.undo.clear();
    }

    /// The current write was refused and changed nothing: what it remembered is undone.
    pub fn write_undone(&mut self) {
        while let Some((turn, before)) = self.undo.pop() {
            match before {
                Some(facts) => self.turns.insert(turn, facts),
                None => self.turns.remove(&turn),
            };
        }
    }

    /// Forgets every turn.
    pub fn forget_all(&mut self) {
        self.turns.clear();
        self.undo.clear();
    }
}
