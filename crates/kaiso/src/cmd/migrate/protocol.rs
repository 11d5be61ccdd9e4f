//! What `kaiso migrate` commands and the daemon exchange over the store's control socket
//! (inside `Request::Migrate { args }`), and the share spec persisted per share.

use serde::{Deserialize, Serialize};

/// One share being migrated, as `start` describes it; persisted as
/// `<state_dir>/migrate/<name>/share.json` so a restarted daemon resumes every share.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareSpec {
    pub name: String,
    /// Source URL (never a password: SMB reads `$KAISO_SMB_PASSWORD`).
    pub url: String,
    /// Store-relative target directory ("" = the store root).
    pub into: String,
    pub order: String,
    pub mode: String,
    pub parallel: usize,
    /// Fetch unit in bytes.
    pub chunk: u64,
    /// Crawl bandwidth limit, bytes per second (a runtime `throttle` is saved here).
    pub rate: Option<u64>,
    /// Paused by `kaiso migrate pause` (until `resume`): a restarted daemon keeps the
    /// share paused. (`start --paused` holds for that start only.)
    #[serde(default)]
    pub paused: bool,
    /// A source entry whose metadata read keeps failing as unreachable (while the share's
    /// root answers) is given up after this many counted failures ...
    #[serde(default = "default_meta_give_up_attempts")]
    pub meta_give_up_attempts: u32,
    /// ... over at least this many milliseconds (`--meta-give-up-after`).
    #[serde(default = "default_meta_give_up_after_ms")]
    pub meta_give_up_after_ms: u64,
}

fn default_meta_give_up_attempts() -> u32 {
    kaiso_store::migrate::meta_retry::DEFAULT_GIVE_UP_ATTEMPTS
}

fn default_meta_give_up_after_ms() -> u64 {
    kaiso_store::migrate::meta_retry::DEFAULT_GIVE_UP_AFTER.as_millis() as u64
}

/// A migrate request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Call {
    Status {
        share: Option<String>,
    },
    Pause {
        share: Option<String>,
    },
    Resume {
        share: Option<String>,
    },
    Throttle {
        share: Option<String>,
        bytes_per_sec: Option<u64>,
    },
    Finish {
        share: Option<String>,
        /// Finish although source entries were left out (the skip report).
        #[serde(default)]
        accept_skipped: bool,
    },
    /// Add a share to the running daemon (N-to-1).
    Add {
        spec: ShareSpec,
        paused: bool,
    },
}

/// One entry of the skip report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkippedEntry {
    /// Source path (lossy UTF-8 for display).
    pub path: String,
    pub kind: String,
    pub reason: String,
}

/// Progress of one share.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShareStatus {
    pub name: String,
    pub source: String,
    pub into: String,
    /// running, paused, done, stopped, stuck, finished, recounting (the counter after an
    /// unclean stop), or "not running" (no daemon).
    pub state: String,
    /// metadata, data or bulk while running.
    pub pass: Option<String>,
    pub rounds: u32,
    /// Remaining-stub counter (0: everything is migrated).
    pub remaining_stubs: u64,
    /// Directories not listed yet (their contents are not known yet).
    pub dirs_pending: u64,
    pub files_done: u64,
    /// Files known so far (done + file stubs); grows while directories are listed.
    pub files_known: u64,
    pub bytes_done: u64,
    pub bytes_known: u64,
    /// Fetched from the source by this daemon since it started.
    pub bytes_fetched: u64,
    pub demand_fetches: u64,
    pub crawl_fetches: u64,
    pub dirs_listed: u64,
    /// Paused by `kaiso migrate pause` (until `resume`): no rate and no ETA then.
    #[serde(default)]
    pub paused: bool,
    /// Bytes (files) fetched over the last 10–11 s, or since the crawl started or
    /// resumed if that is shorter (at least 1 s); 0 while paused or before 1 s. See
    /// `super::rate`.
    pub bytes_per_sec: f64,
    pub files_per_sec: f64,
    /// Estimated seconds to completion at the current rate (None: unknown, or paused).
    pub eta_secs: Option<f64>,
    pub throttle_bytes_per_sec: Option<u64>,
    pub elapsed_secs: f64,
    pub skipped: Vec<SkippedEntry>,
    /// What failed in the crawl's current round (the last one once it is stuck).
    #[serde(default)]
    pub crawl_failures: Vec<CrawlFailureEntry>,
    /// Why a crawl that ended stuck is stuck when its source stopped answering: since
    /// when, the source's error, and that the daemon retries (None otherwise).
    #[serde(default)]
    pub source_problem: Option<String>,
    /// Entries whose metadata the source has not given although it answers: retried
    /// until the share's bound, then skipped (`kaiso_store::migrate::meta_retry`).
    #[serde(default)]
    pub metadata_retries: Vec<MetadataRetryEntry>,
}

/// An entry whose metadata read keeps failing as unreachable while its source answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetadataRetryEntry {
    /// Source path (lossy UTF-8 for display).
    pub path: String,
    /// Counted failures so far.
    pub attempts: u32,
    /// Given up at a failure once both are reached.
    pub give_up_attempts: u32,
    pub give_up_after_secs: u64,
    /// Seconds since the Unix epoch of the first counted failure.
    pub first_failed_unix: u64,
    pub last_error: String,
    /// One line saying all of it.
    pub text: String,
}

/// One object the crawl could not fetch, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrawlFailureEntry {
    /// Store inode number (as `stat` on the mount shows it; 0: the state database).
    pub ino: u64,
    pub step: String,
    pub error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    /// false when no daemon runs (figures come from the state databases).
    pub daemon: bool,
    pub shares: Vec<ShareStatus>,
}

/// What `finish` verified for one share.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishSummary {
    pub share: String,
    pub source: String,
    pub verified_files: u64,
    pub verified_bytes: u64,
    pub modified_by_clients: u64,
    pub deleted_by_clients: u64,
    /// Files no client modified whose bytes differed from the source: fetched again
    /// and verified again.
    #[serde(default)]
    pub refetched: Vec<String>,
    /// Files that changed on the source after their copy completed: fetched again, with
    /// both sizes/mtimes (neither verified nor a mismatch).
    #[serde(default)]
    pub changed_on_source: Vec<String>,
    pub skipped: Vec<SkippedEntry>,
    /// What was migrated differently from the source (e.g. owners not kept), not left
    /// out.
    #[serde(default)]
    pub notices: Vec<SkippedEntry>,
    /// The report file left next to where the state was.
    pub report: String,
}
