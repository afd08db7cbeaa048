//! Mapping SQLite's errors onto the store's.

use agentry_memory::StoreError;
use rusqlite::ErrorCode;

/// Turns an SQLite error into a store error that names the problem.
pub(crate) fn sqlite(error: rusqlite::Error) -> StoreError {
    match &error {
        rusqlite::Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::DatabaseCorrupt => StoreError::Corrupt(format!("the SQLite file is damaged: {error}")),
            ErrorCode::NotADatabase => {
                StoreError::Corrupt(format!("the file is not an SQLite database: {error}"))
            }
            ErrorCode::CannotOpen => StoreError::Io(format!(
                "cannot open the SQLite file (does it exist, and can this user read and write it and \
                 its directory?): {error}"
            )),
            ErrorCode::DiskFull => StoreError::Io(format!("the disk is full: {error}")),
            ErrorCode::ReadOnly if failure.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED => {
                StoreError::Io(
                    "the SQLite file was removed or replaced since the store opened it: writes are \
                     refused, since they would be lost (reopen the store)"
                        .to_owned(),
                )
            }
            ErrorCode::ReadOnly if failure.extended_code == rusqlite::ffi::SQLITE_READONLY_DIRECTORY => {
                StoreError::Io(format!(
                    "the directory holding the SQLite file is not writable (SQLite creates its \
                     -wal and -shm files beside it): {error}"
                ))
            }
            ErrorCode::ReadOnly | ErrorCode::PermissionDenied => {
                StoreError::Io(format!("the SQLite file is not writable: {error}"))
            }
            _ => StoreError::Io(format!("SQLite failed: {error}")),
        },
        _ => StoreError::Io(format!("SQLite failed: {error}")),
    }
}
