//! Renderers: pure translations of the canonical stream into each wire vocabulary.
//!
//! Stateless vocabularies are functions of one event ([`harness::render`],
//! [`agent_team::render`]); vocabularies that open and close frames or accumulate a
//! result are folds over a turn's events ([`agui::AguiRenderer`], [`agno::AgnoRenderer`],
//! [`adalflow::AdalFlowRenderer`]). None does I/O.

pub mod adalflow;
pub mod agent_team;
pub mod agno;
pub mod agui;
pub mod harness;
