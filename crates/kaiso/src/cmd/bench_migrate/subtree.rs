//! A [`Source`] rooted at a subdirectory of another source, so one export can hold many
//! benchmark trees and each migration still sees its tree as the whole share.

use kaiso_store::migrate::{
    Source, SourceAcl, SourceAttr, SourceEntry, SourceFeatures, SourcePath, SourceResult,
    SourceStream,
};

pub struct Subtree {
    inner: Box<dyn Source>,
    base: SourcePath,
}

impl Subtree {
    pub fn new(inner: Box<dyn Source>, base: &str) -> SourceResult<Self> {
        Ok(Self {
            inner,
            base: SourcePath::parse(base.as_bytes())?,
        })
    }

    fn map(&self, p: &SourcePath) -> SourceResult<SourcePath> {
        let mut out = self.base.clone();
        for c in p.components() {
            out = out.join(c)?;
        }
        Ok(out)
    }
}

impl Source for Subtree {
    fn describe(&self) -> String {
        format!("{}/{}", self.inner.describe(), self.base)
    }
    fn features(&self) -> SourceFeatures {
        self.inner.features()
    }
    fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
        self.inner.stat(&self.map(p)?)
    }
    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.inner.read_dir(&self.map(p)?)
    }
    fn read_dir_with_attr(
        &self,
        p: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        self.inner.read_dir_with_attr(&self.map(p)?)
    }
    fn read_into(
        &self,
        p: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.inner.read_into(&self.map(p)?, offset, buf)
    }
    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.inner.read(&self.map(p)?, offset, len)
    }
    fn read_with_attr(
        &self,
        p: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.inner.read_with_attr(&self.map(p)?, offset, len)
    }
    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.inner.read_link(&self.map(p)?)
    }
    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.xattrs(&self.map(p)?)
    }
    fn acl(&self, p: &SourcePath) -> SourceResult<SourceAcl> {
        self.inner.acl(&self.map(p)?)
    }
    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.inner.streams(&self.map(p)?)
    }
    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.inner.read_stream(&self.map(p)?, stream, offset, len)
    }
}
