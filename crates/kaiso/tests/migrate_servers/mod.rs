//! Real source servers for the `kaiso migrate` CLI tests: the nfs-ganesha and smbd of
//! crates/source/tests/common (shared by path: a test crate cannot import another's
//! helpers), plus the source URLs the `kaiso migrate` command line takes.

#![allow(dead_code)]

#[path = "../../../source/tests/common/mod.rs"]
mod source_servers;

use std::ops::Deref;
use std::path::Path;

/// Whether the servers can run here: the programs are installed and we are root. In CI
/// (`$CI` set, scripts/deps/*.list installed, root) a missing one is a failure.
pub fn servers_available(programs: &[&str]) -> bool {
    source_servers::have(programs)
}

/// nfs-ganesha exporting one directory read-only over NFSv3 as `/kaiso_src`.
pub struct Ganesha(source_servers::Ganesha);

impl Ganesha {
    pub fn start(export: &Path) -> Ganesha {
        Ganesha(source_servers::Ganesha::start(export))
    }

    /// The source URL of an export path of this server (for `kaiso migrate start`).
    pub fn url_of(&self, export: &str) -> String {
        format!(
            "nfs://127.0.0.1:{}{export}?mountport={}",
            self.0.nfs_port, self.0.mount_port
        )
    }

    pub fn url(&self) -> String {
        self.url_of(&self.0.pseudo)
    }
}

impl Deref for Ganesha {
    type Target = source_servers::Ganesha;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Samba's smbd sharing one directory read-only as `src` to user root with a password.
pub struct Samba(source_servers::Samba);

impl Samba {
    pub fn start(share: &Path) -> Samba {
        Samba(source_servers::Samba::start_read_only(share))
    }

    /// The source URL (the password goes in `$KAISO_SMB_PASSWORD`).
    pub fn url(&self) -> String {
        format!(
            "smb://{}@127.0.0.1:{}/{}",
            source_servers::SMB_USER,
            self.0.port,
            source_servers::SMB_SHARE
        )
    }
}

impl Deref for Samba {
    type Target = source_servers::Samba;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
