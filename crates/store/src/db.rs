//! The metadata database (SQLite, WAL) under the state directory.
//!
//! It holds only what the tier directories cannot: inode numbers that must survive moves
//! (`remap`) and directory inode numbers (`dirs`), the move/rename journal, pins, heat
//! checkpoints, placement reasons, stub state, and per-tier usage at clean shutdown. The
//! tiers themselves stay the truth for the tree and the data.
//!
//! Durability rule. The database runs in WAL mode with `synchronous=NORMAL`: every commit
//! is in the WAL (the OS page cache) before the call returns, so it survives a crash of the
//! kaiso process (kill -9) without any fsync; only an OS crash or power loss can drop the
//! last commits. The rows whose loss would lose data are written with `synchronous=FULL`
//! (fsynced before the call returns): a move's journal row before the copy it guards, its
//! `copied` state before the rename, and the switch (journal state + inode remap) before the
//! source is deleted. Everything else is re-derivable: after an OS crash, a directory or
//! colliding file whose number row was lost gets a number again at the next scan (possibly
//! a new one), and heat restarts from the last checkpoint.
//! Creating or unlinking an ordinary file writes nothing here at all (its inode number is
//! derived from its backing inode, see `namespace`), so the metadata path needs no group
//! commit.

use rusqlite::{Connection, OptionalExtension, params};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// (atime, mtime) a stub file must show (see [`crate::StubState::times`]).
pub(crate) type StubTimes = (std::time::SystemTime, std::time::SystemTime);

/// (inode, unlisted directory, missing ranges, pending times).
pub(crate) type StubRow = (u64, bool, Vec<(u64, u64)>, Option<StubTimes>);

/// Pending times as stored: atime seconds (i64), nanoseconds (u32), then mtime's.
fn encode_times(t: StubTimes) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    for x in [t.0, t.1] {
        let ts = crate::util::timespec_of(x);
        b.extend_from_slice(&ts.tv_sec.to_le_bytes());
        b.extend_from_slice(&(ts.tv_nsec as u32).to_le_bytes());
    }
    b
}

fn decode_times(b: &[u8]) -> Option<StubTimes> {
    if b.len() != 24 {
        return None;
    }
    let one = |c: &[u8]| {
        let secs = i64::from_le_bytes(c[..8].try_into().ok()?);
        let nanos = u32::from_le_bytes(c[8..12].try_into().ok()?);
        Some(crate::util::ts(secs, nanos as i64))
    };
    Some((one(&b[..12])?, one(&b[12..])?))
}

/// The page size of new store databases. Every commit appends each page it changed to
/// the WAL, whole: a fetch that completes a file deletes its stub row (about 100 B), one
/// commit per file, which cost a 4 KiB page of WAL with SQLite's default (about 5 KB a
/// file with the B-tree's other pages), and the WAL's bound
/// (`crate::stub::HOLD_WAL_BYTES`) then held the crawl while a checkpoint's `syncfs` ran.
/// With 1 KiB pages it costs about 2 KB (measured: docs/reproduction/migration.md §3,
/// session 16). The migration databases use the same size
/// (`crate::migrate::state`). A database created before keeps its page size.
pub(crate) const PAGE_SIZE: i64 = 1024;

pub(crate) struct Db {
    pub conn: Connection,
}

thread_local! {
    /// Backing identities of new stub files noted on this thread, each written with the
    /// file's next stub row (`Db::set_stub`), which this thread writes: directly, or when
    /// its `Store::stub_batch` commits.
    static PENDING_IDENTITIES: std::cell::RefCell<std::collections::HashMap<u64, Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Records `ident` (an encoded [`crate::stub::BackingIdentity`]) with the next stub row
/// this thread writes for `ino`. Called right before that row is written or queued.
pub(crate) fn note_stub_identity(ino: u64, ident: Vec<u8>) {
    PENDING_IDENTITIES.with(|p| p.borrow_mut().insert(ino, ident));
}

/// One journal row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct JournalRow {
    pub id: i64,
    pub kind: String,
    pub ino: u64,
    pub from_tier: u8,
    pub to_tier: u8,
    pub src_bino: u64,
    pub dst_bino: u64,
    /// Store-relative paths (a move's link group; a rename's from/to).
    pub names: Vec<PathBuf>,
    pub tmp: PathBuf,
    pub state: String,
}

fn pack(paths: &[PathBuf]) -> Vec<u8> {
    let mut v = Vec::new();
    for p in paths {
        v.extend_from_slice(p.as_os_str().as_bytes());
        v.push(0);
    }
    v
}

fn unpack(b: &[u8]) -> Vec<PathBuf> {
    b.split(|c| *c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| PathBuf::from(std::ffi::OsString::from_vec(s.to_vec())))
        .collect()
}

pub(crate) fn pbytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// Bytes the connection `conn` appended to its WAL so far: pages written (each a WAL
/// frame) times the frame size (tests: the WAL cost of a crawl's rows).
#[cfg(test)]
pub(crate) fn wal_bytes_written(conn: &Connection) -> u64 {
    let page: i64 = conn
        .pragma_query_value(None, "page_size", |r| r.get(0))
        .unwrap_or(4096);
    let (mut cur, mut hi) = (0, 0);
    // SAFETY: a live connection's handle, two integers to fill, no reset.
    unsafe {
        rusqlite::ffi::sqlite3_db_status(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBSTATUS_CACHE_WRITE,
            &mut cur,
            &mut hi,
            0,
        );
    }
    cur as u64 * (page as u64 + 24)
}

impl Db {
    pub fn open(state_dir: &Path) -> rusqlite::Result<Db> {
        let conn = Connection::open(state_dir.join("kaiso.db"))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // Before the first write: only a new database takes it (see `PAGE_SIZE`).
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS tiers(name TEXT PRIMARY KEY, slot INTEGER NOT NULL UNIQUE);
             CREATE TABLE IF NOT EXISTS remap(slot INTEGER NOT NULL, bino INTEGER NOT NULL, ino INTEGER NOT NULL UNIQUE, PRIMARY KEY(slot, bino));
             CREATE TABLE IF NOT EXISTS dirs(path BLOB PRIMARY KEY, ino INTEGER NOT NULL UNIQUE);
             CREATE TABLE IF NOT EXISTS journal(id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, ino INTEGER NOT NULL,
                 from_tier INTEGER NOT NULL, to_tier INTEGER NOT NULL, src_bino INTEGER NOT NULL, dst_bino INTEGER NOT NULL,
                 names BLOB NOT NULL, tmp BLOB NOT NULL, state TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS pins(ino INTEGER PRIMARY KEY, tier INTEGER NOT NULL, path BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS heat(ino INTEGER PRIMARY KEY, heat REAL NOT NULL, last INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS reasons(ino INTEGER PRIMARY KEY, rule TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS stubs(ino INTEGER PRIMARY KEY, unlisted INTEGER NOT NULL, missing BLOB NOT NULL, times BLOB, ident BLOB);",
        )?;
        // Databases from before pending times lack the column (NULL: no pending times).
        let has_times = conn
            .prepare("SELECT 1 FROM pragma_table_info('stubs') WHERE name='times'")?
            .exists([])?;
        if !has_times {
            conn.execute_batch("ALTER TABLE stubs ADD COLUMN times BLOB")?;
        }
        // Databases from before backing identities lack this one (NULL: none recorded,
        // the row is trusted as before; see `crate::stub::BackingIdentity`).
        let has_ident = conn
            .prepare("SELECT 1 FROM pragma_table_info('stubs') WHERE name='ident'")?
            .exists([])?;
        if !has_ident {
            conn.execute_batch("ALTER TABLE stubs ADD COLUMN ident BLOB")?;
        }
        // The ctime clients see of a partly fetched file (`crate::stub::CtimeMask`),
        // kept across restarts since session 12 (NULL: none).
        let has_ctime = conn
            .prepare("SELECT 1 FROM pragma_table_info('stubs') WHERE name='ctime'")?
            .exists([])?;
        if !has_ctime {
            conn.execute_batch("ALTER TABLE stubs ADD COLUMN ctime BLOB")?;
        }
        Ok(Db { conn })
    }

    pub fn meta(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key=?1", [key], |r| r.get(0))
            .optional()
    }

    pub fn set_meta(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "INSERT INTO meta(key,value) VALUES(?1,?2) ON CONFLICT(key) DO UPDATE SET value=?2",
            params![key, value],
        )?;
        Ok(())
    }

    /// Stable slot numbers of tiers by name (slots never change once given).
    pub fn tier_slots(&self, names: &[String]) -> rusqlite::Result<Vec<u8>> {
        let mut out = Vec::new();
        for n in names {
            let slot: Option<i64> = self
                .conn
                .query_row("SELECT slot FROM tiers WHERE name=?1", [n], |r| r.get(0))
                .optional()?;
            let slot = match slot {
                Some(s) => s,
                None => {
                    let next: i64 = self.conn.query_row(
                        "SELECT COALESCE(MAX(slot),0)+1 FROM tiers",
                        [],
                        |r| r.get(0),
                    )?;
                    self.conn.execute(
                        "INSERT INTO tiers(name,slot) VALUES(?1,?2)",
                        params![n, next],
                    )?;
                    next
                }
            };
            out.push(slot.clamp(1, 250) as u8);
        }
        Ok(out)
    }

    pub fn remaps(&self) -> rusqlite::Result<Vec<(u8, u64, u64)>> {
        let mut st = self.conn.prepare("SELECT slot, bino, ino FROM remap")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u8,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        })?;
        rows.collect()
    }

    pub fn set_remap(&self, slot: u8, bino: u64, ino: u64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM remap WHERE ino=?1", [ino as i64])?;
        self.conn.execute(
            "INSERT INTO remap(slot,bino,ino) VALUES(?1,?2,?3) ON CONFLICT(slot,bino) DO UPDATE SET ino=?3",
            params![slot as i64, bino as i64, ino as i64],
        )?;
        Ok(())
    }

    pub fn drop_remap_ino(&self, ino: u64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM remap WHERE ino=?1", [ino as i64])?;
        Ok(())
    }

    pub fn dirs(&self) -> rusqlite::Result<Vec<(PathBuf, u64)>> {
        let mut st = self.conn.prepare("SELECT path, ino FROM dirs")?;
        let rows = st.query_map([], |r| {
            let b: Vec<u8> = r.get(0)?;
            Ok((
                PathBuf::from(std::ffi::OsString::from_vec(b)),
                r.get::<_, i64>(1)? as u64,
            ))
        })?;
        rows.collect()
    }

    pub fn add_dir(&self, path: &Path, ino: u64) -> rusqlite::Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO dirs(path, ino) VALUES(?1,?2)",
            params![pbytes(path), ino as i64],
        )?;
        Ok(())
    }

    pub fn remove_dir(&self, path: &Path) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM dirs WHERE path=?1", [pbytes(path)])?;
        Ok(())
    }

    /// Rename a directory and everything below it in the `dirs` table.
    pub fn rename_dirs(&self, from: &Path, to: &Path) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        let rows: Vec<(Vec<u8>, i64)> = {
            let mut st = tx.prepare("SELECT path, ino FROM dirs")?;
            let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            it.collect::<rusqlite::Result<_>>()?
        };
        let f = pbytes(from);
        for (p, ino) in rows {
            let under = p == f || (p.len() > f.len() && p.starts_with(f) && p[f.len()] == b'/');
            if under {
                let mut np = pbytes(to).to_vec();
                np.extend_from_slice(&p[f.len()..]);
                tx.execute("DELETE FROM dirs WHERE path=?1", [&p])?;
                tx.execute(
                    "INSERT OR REPLACE INTO dirs(path, ino) VALUES(?1,?2)",
                    params![np, ino],
                )?;
            }
        }
        tx.commit()
    }

    /// Journal writes are made durable (synchronous=FULL) before the data step they guard.
    pub fn journal_add(&self, row: &JournalRow) -> rusqlite::Result<i64> {
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let r = self.conn.execute(
            "INSERT INTO journal(kind,ino,from_tier,to_tier,src_bino,dst_bino,names,tmp,state) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
            params![
                row.kind,
                row.ino as i64,
                row.from_tier as i64,
                row.to_tier as i64,
                row.src_bino as i64,
                row.dst_bino as i64,
                pack(&row.names),
                pbytes(&row.tmp),
                row.state
            ],
        );
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        r?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn journal_done(&self, id: i64) -> rusqlite::Result<()> {
        self.conn.execute("DELETE FROM journal WHERE id=?1", [id])?;
        Ok(())
    }

    pub fn journal(&self) -> rusqlite::Result<Vec<JournalRow>> {
        let mut st = self.conn.prepare("SELECT id,kind,ino,from_tier,to_tier,src_bino,dst_bino,names,tmp,state FROM journal ORDER BY id")?;
        let rows = st.query_map([], |r| {
            let names: Vec<u8> = r.get(7)?;
            let tmp: Vec<u8> = r.get(8)?;
            Ok(JournalRow {
                id: r.get(0)?,
                kind: r.get(1)?,
                ino: r.get::<_, i64>(2)? as u64,
                from_tier: r.get::<_, i64>(3)? as u8,
                to_tier: r.get::<_, i64>(4)? as u8,
                src_bino: r.get::<_, i64>(5)? as u64,
                dst_bino: r.get::<_, i64>(6)? as u64,
                names: unpack(&names),
                tmp: PathBuf::from(std::ffi::OsString::from_vec(tmp)),
                state: r.get(9)?,
            })
        })?;
        rows.collect()
    }

    pub fn pins(&self) -> rusqlite::Result<Vec<(u64, u8)>> {
        let mut st = self.conn.prepare("SELECT ino, tier FROM pins")?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u8))
        })?;
        rows.collect()
    }

    pub fn set_pin(&self, ino: u64, tier: Option<u8>, path: &Path) -> rusqlite::Result<()> {
        match tier {
            Some(t) => self.conn.execute(
                "INSERT OR REPLACE INTO pins(ino,tier,path) VALUES(?1,?2,?3)",
                params![ino as i64, t as i64, pbytes(path)],
            )?,
            None => self
                .conn
                .execute("DELETE FROM pins WHERE ino=?1", [ino as i64])?,
        };
        Ok(())
    }

    pub fn heat(&self) -> rusqlite::Result<Vec<(u64, f64, u64)>> {
        let mut st = self.conn.prepare("SELECT ino, heat, last FROM heat")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get(1)?,
                r.get::<_, i64>(2)? as u64,
            ))
        })?;
        rows.collect()
    }

    pub fn save_heat(
        &self,
        rows: &[(u64, f64, u64)],
        reasons: &[(u64, String)],
    ) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute("DELETE FROM heat", [])?;
        {
            let mut st = tx.prepare("INSERT INTO heat(ino,heat,last) VALUES(?1,?2,?3)")?;
            for (i, h, l) in rows {
                st.execute(params![*i as i64, h, *l as i64])?;
            }
            let mut st = tx.prepare("INSERT OR REPLACE INTO reasons(ino,rule) VALUES(?1,?2)")?;
            for (i, r) in reasons {
                st.execute(params![*i as i64, r])?;
            }
        }
        tx.commit()
    }

    pub fn reason(&self, ino: u64) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT rule FROM reasons WHERE ino=?1", [ino as i64], |r| {
                r.get(0)
            })
            .optional()
    }

    pub fn forget_file(&self, ino: u64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM remap WHERE ino=?1", [ino as i64])?;
        self.conn
            .execute("DELETE FROM pins WHERE ino=?1", [ino as i64])?;
        self.conn
            .execute("DELETE FROM reasons WHERE ino=?1", [ino as i64])?;
        self.conn
            .execute("DELETE FROM stubs WHERE ino=?1", [ino as i64])?;
        Ok(())
    }

    pub fn stubs(&self) -> rusqlite::Result<Vec<StubRow>> {
        let mut st = self
            .conn
            .prepare("SELECT ino, unlisted, missing, times FROM stubs")?;
        let rows = st.query_map([], |r| {
            let b: Vec<u8> = r.get(2)?;
            let ranges = b
                .chunks_exact(16)
                .map(|c| {
                    (
                        u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                        u64::from_le_bytes(c[8..].try_into().unwrap_or_default()),
                    )
                })
                .collect();
            let times: Option<Vec<u8>> = r.get(3)?;
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? != 0,
                ranges,
                times.as_deref().and_then(decode_times),
            ))
        })?;
        rows.collect()
    }

    pub fn set_stub(
        &self,
        ino: u64,
        unlisted: bool,
        missing: &[(u64, u64)],
        times: Option<StubTimes>,
    ) -> rusqlite::Result<()> {
        // A row keeps the identity of the backing file it was created for, unless this
        // thread noted one for it (a new stub: `note_stub_identity`).
        let ident = PENDING_IDENTITIES.with(|p| p.borrow_mut().remove(&ino));
        // A store write into this file under way on this thread: the ctime mask it leaves
        // (`crate::stub::CtimeMask`) goes with the row; else the recorded one stays.
        let ctime = crate::stub::store_write_mask(ino).map(encode_times);
        // Cached statements: a listing writes one row per entry, a fetch one per unit.
        if !unlisted && missing.is_empty() {
            self.conn
                .prepare_cached("DELETE FROM stubs WHERE ino=?1")?
                .execute([ino as i64])?;
            return Ok(());
        }
        let mut b = Vec::with_capacity(missing.len() * 16);
        for (s, e) in missing {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&e.to_le_bytes());
        }
        self.conn
            .prepare_cached(
                "INSERT INTO stubs(ino,unlisted,missing,times,ident,ctime) VALUES(?1,?2,?3,?4,?5,?6)
                 ON CONFLICT(ino) DO UPDATE SET unlisted=excluded.unlisted,
                 missing=excluded.missing, times=excluded.times,
                 ident=COALESCE(excluded.ident, stubs.ident),
                 ctime=COALESCE(excluded.ctime, stubs.ctime)",
            )?
            .execute(params![
                ino as i64,
                unlisted as i64,
                b,
                times.map(encode_times),
                ident,
                ctime
            ])?;
        Ok(())
    }

    /// The recorded ctime masks (shown, real) of stub rows, by inode number (see
    /// `crate::stub::CtimeMask`).
    pub fn stub_ctimes(&self) -> rusqlite::Result<Vec<(u64, StubTimes)>> {
        let mut st = self
            .conn
            .prepare("SELECT ino, ctime FROM stubs WHERE ctime IS NOT NULL")?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
        })?;
        Ok(rows
            .filter_map(|r| r.ok())
            .filter_map(|(ino, b)| Some((ino, decode_times(&b)?)))
            .collect())
    }

    /// The recorded backing identities of stub rows, by inode number.
    pub fn stub_identities(&self) -> rusqlite::Result<Vec<(u64, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare("SELECT ino, ident FROM stubs WHERE ident IS NOT NULL")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))?;
        rows.collect()
    }

    /// Drops the stub row of `ino` (a row left by a file that is gone).
    pub fn drop_stub_row(&self, ino: u64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM stubs WHERE ino=?1", [ino as i64])?;
        Ok(())
    }
}

impl Db {
    /// The atomic switch of a move: journal state and the file's inode-number mapping in
    /// one durable transaction.
    pub fn journal_switch(
        &self,
        id: i64,
        names: &[PathBuf],
        remap: Option<(u8, u64, u64)>,
        ino: u64,
    ) -> rusqlite::Result<()> {
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let r = (|| {
            let tx = self.conn.unchecked_transaction()?;
            tx.execute(
                "UPDATE journal SET state='switched', names=?2 WHERE id=?1",
                params![id, pack(names)],
            )?;
            tx.execute("DELETE FROM remap WHERE ino=?1", [ino as i64])?;
            if let Some((slot, bino, ino)) = remap {
                tx.execute(
                    "INSERT INTO remap(slot,bino,ino) VALUES(?1,?2,?3) ON CONFLICT(slot,bino) DO UPDATE SET ino=?3",
                    params![slot as i64, bino as i64, ino as i64],
                )?;
            }
            tx.commit()
        })();
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        r
    }

    pub fn journal_set_names(
        &self,
        id: i64,
        names: &[PathBuf],
        dst_bino: u64,
    ) -> rusqlite::Result<()> {
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let r = self.conn.execute(
            "UPDATE journal SET names=?2, dst_bino=?3, state='copied' WHERE id=?1",
            params![id, pack(names), dst_bino as i64],
        );
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fetch that completes a file deletes its stub row, one commit per file: with the
    /// store's own page size that costs well under a 4 KiB page of WAL (it cost about
    /// 5 KB with SQLite's default pages, and the crawl was held at the WAL's bound while
    /// a checkpoint's `syncfs` ran). A database created before keeps its page size.
    #[test]
    fn a_completed_stub_costs_less_than_a_default_page_of_wal() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let page: i64 = db
            .conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        assert_eq!(page, PAGE_SIZE, "a new store database takes PAGE_SIZE");
        // Rows as a listing writes them: missing ranges, pending times, an identity.
        const FILES: u64 = 2000;
        let now = std::time::SystemTime::now();
        let tx = db.conn.unchecked_transaction().unwrap();
        for ino in 1000..1000 + FILES {
            note_stub_identity(ino, vec![7; 21]);
            db.set_stub(ino, false, &[(0, 100_000)], Some((now, now)))
                .unwrap();
        }
        tx.commit().unwrap();
        let before = wal_bytes_written(&db.conn);
        for ino in 1000..1000 + FILES {
            db.set_stub(ino, false, &[], Some((now, now))).unwrap();
        }
        let per_file = (wal_bytes_written(&db.conn) - before) / FILES;
        eprintln!("WAL bytes per completed stub: {per_file}");
        assert!(
            per_file < 2500,
            "a completed stub should cost under 2500 B of WAL (one small page and a share \
             of its B-tree's rebalancing), not {per_file} B"
        );
        assert!(db.stubs().unwrap().is_empty());
        drop(db);
        // An existing database with SQLite's default pages keeps them.
        let old_dir = tempfile::tempdir().unwrap();
        {
            let old = Connection::open(old_dir.path().join("kaiso.db")).unwrap();
            old.execute_batch("PRAGMA page_size=4096; CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);")
                .unwrap();
        }
        let old = Db::open(old_dir.path()).unwrap();
        let page: i64 = old
            .conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        assert_eq!(page, 4096, "an existing database keeps its page size");
        old.set_stub(5, false, &[(0, 1)], None).unwrap();
        assert_eq!(old.stubs().unwrap(), vec![(5, false, vec![(0, 1)], None)]);
    }

    /// A database from before backing identities gets the column; its rows have none
    /// (trusted as before). A new stub's noted identity is written with its row and kept
    /// by later writes of the row, and goes with the row.
    #[test]
    fn stub_rows_keep_the_identity_noted_at_their_creation() {
        let dir = tempfile::tempdir().unwrap();
        {
            let old = Connection::open(dir.path().join("kaiso.db")).unwrap();
            old.execute_batch(
                "CREATE TABLE stubs(ino INTEGER PRIMARY KEY, unlisted INTEGER NOT NULL, missing BLOB NOT NULL, times BLOB);
                 INSERT INTO stubs(ino, unlisted, missing) VALUES(7, 0, X'0000000000000000FF00000000000000');",
            )
            .unwrap();
        }
        let db = Db::open(dir.path()).unwrap();
        assert_eq!(db.stubs().unwrap(), vec![(7, false, vec![(0, 255)], None)]);
        assert!(
            db.stub_identities().unwrap().is_empty(),
            "old rows have none"
        );
        db.set_stub(7, false, &[(0, 100)], None).unwrap();
        assert!(db.stub_identities().unwrap().is_empty());

        note_stub_identity(8, b"id-8".to_vec());
        db.set_stub(8, false, &[(0, 10)], None).unwrap();
        db.set_stub(8, false, &[(5, 10)], None).unwrap();
        assert_eq!(db.stub_identities().unwrap(), vec![(8, b"id-8".to_vec())]);
        // Written once: a later row of another file with that number has none.
        db.set_stub(8, false, &[], None).unwrap();
        db.set_stub(8, false, &[(0, 1)], None).unwrap();
        assert!(db.stub_identities().unwrap().is_empty());
        db.drop_stub_row(8).unwrap();
        db.drop_stub_row(7).unwrap();
        assert!(db.stubs().unwrap().is_empty());
    }
}
