//! The runner's and the team's acceptance scenarios on real SQLite and redb files (neither
//! crate can name a storage crate, so they run here).

mod sqlite {
    use std::sync::Arc;

    use agentry_memory::conformance::Harness;
    use agentry_storage_sqlite::{SqliteOptions, SqliteStore};

    async fn fresh() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runner.db"), SqliteOptions::default()).unwrap();
        Harness::with_guard(Arc::new(store), dir)
    }

    agentry_runner::runner_scenarios!(fresh);

    mod team {
        agentry_team::team_scenarios!(super::fresh);
    }
}

mod redb {
    use std::sync::Arc;

    use agentry_memory::conformance::Harness;
    use agentry_storage_redb::{RedbOptions, RedbStore};

    async fn fresh() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("runner.redb"), RedbOptions::default()).unwrap();
        Harness::with_guard(Arc::new(store), dir)
    }

    agentry_runner::runner_scenarios!(fresh);

    mod team {
        agentry_team::team_scenarios!(super::fresh);
    }
}
