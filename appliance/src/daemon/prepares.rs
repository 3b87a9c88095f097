//! A partition group's prepare log: the consensus half of its journal. The batches of
//! SendMessages prepares are written to the segment log itself at prepare time (each
//! byte written once); this file holds, per op, the 256-byte prepare header, where its
//! batch lies in the log (base and next offset), the stamp position after it, and the
//! body of prepares that carry no batch (consumer offsets). A prepare is durable when
//! both its batch and its record are.
//!
//! Record: magic "PRP1", inline body length u32, base_offset u64, next_offset u64,
//! last_timestamp u64, the prepare header (256), the inline body, then XxHash3-64 of all
//! of it. Records are contiguous ops whose parent links and offsets chain; the first
//! record that is torn, fails its checksum or breaks the chain ends the file (what
//! follows was never acknowledged: acks wait for the record).

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::io::BufferedFile;
use journal::IntoIoError;
use replication::wire::PrepareHeader;
use zerocopy::{FromBytes, IntoBytes};

/// The prepare log's file name inside a partition's folder.
pub const PREPARES_FILE: &str = "vsr-prepares";

const MAGIC: &[u8; 4] = b"PRP1";
const FIXED_LEN: usize = 4 + 4 + 8 + 8 + 8 + 256;
/// Inline bodies are small consumer-offset operations.
pub const INLINE_BODY_MAX: usize = 64 * 1024;

/// One prepare as recorded.
#[derive(Clone, Debug)]
pub struct Record {
    pub header: PrepareHeader,
    pub base_offset: u64,
    pub next_offset: u64,
    pub last_timestamp: u64,
    /// The body when it is not a batch in the segment log.
    pub inline: Vec<u8>,
}

impl Record {
    pub fn op(&self) -> u64 {
        self.header.op
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_LEN + self.inline.len() + 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.inline.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.base_offset.to_le_bytes());
        out.extend_from_slice(&self.next_offset.to_le_bytes());
        out.extend_from_slice(&self.last_timestamp.to_le_bytes());
        out.extend_from_slice(self.header.as_bytes());
        out.extend_from_slice(&self.inline);
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes the record at the start of `bytes`: the record and its length, or None
    /// when it is torn or damaged.
    fn decode(bytes: &[u8]) -> Option<(Record, usize)> {
        if bytes.len() < FIXED_LEN + 8 || &bytes[..4] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let inline_len = u32_at(4) as usize;
        if inline_len > INLINE_BODY_MAX {
            return None;
        }
        let len = FIXED_LEN + inline_len + 8;
        if bytes.len() < len {
            return None;
        }
        let sum = u64_at(len - 8);
        if xxhash_rust::xxh3::xxh3_64(&bytes[..len - 8]) != sum {
            return None;
        }
        let header = PrepareHeader::read_from_bytes(&bytes[32..FIXED_LEN]).ok()?;
        let record = Record {
            header,
            base_offset: u64_at(8),
            next_offset: u64_at(16),
            last_timestamp: u64_at(24),
            inline: bytes[FIXED_LEN..FIXED_LEN + inline_len].to_vec(),
        };
        Some((record, len))
    }
}

/// Where one record lies, and what consensus and reads need of it without the file.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub op: u64,
    pub identity: u128,
    pub base_offset: u64,
    pub next_offset: u64,
    pub last_timestamp: u64,
    position: u64,
}

/// The prepare log of one partition group. Not `Send` (glommio file).
///
/// Its file is open only while records are written: `open_for_writes` opens it, and
/// `close_idle` syncs and closes it once no record was written for a while, so an idle
/// partition holds no descriptor for it. The records' index stays in memory either way.
pub struct PrepareLog {
    path: PathBuf,
    /// Shared with a planned record write or a sync in flight.
    file: Option<Rc<BufferedFile>>,
    /// When the last record was written (or the file opened).
    last_write: Instant,
    entries: VecDeque<Entry>,
    end: u64,
}

/// Why the prepare log could not be read or written.
#[derive(Debug)]
pub enum PrepareLogError {
    /// An IO call on the file (or its folder) failed.
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file no longer holds what the index says it does.
    Corrupt {
        path: PathBuf,
        op: Option<u64>,
        reason: &'static str,
    },
    /// No record of `op` is held.
    NoRecord { op: u64 },
    /// Records handed to the log do not follow it: `op` came after `after`.
    OutOfOrder { op: u64, after: u64 },
    /// A write needs the file open (`open_for_writes`).
    NotOpen { path: PathBuf },
    /// A planned write or sync still holds the file.
    InUse { path: PathBuf },
}

impl core::fmt::Display for PrepareLogError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PrepareLogError::Io { op, path, source } => {
                write!(f, "{op} {}: {source}", path.display())
            }
            PrepareLogError::Corrupt {
                path,
                op: Some(op),
                reason,
            } => write!(f, "{}: the record of op {op} {reason}", path.display()),
            PrepareLogError::Corrupt {
                path,
                op: None,
                reason,
            } => write!(f, "prepare log {} {reason}", path.display()),
            PrepareLogError::NoRecord { op } => write!(f, "no record of op {op}"),
            PrepareLogError::OutOfOrder { op, after } => {
                write!(f, "prepare log: op {op} does not follow {after}")
            }
            PrepareLogError::NotOpen { path } => {
                write!(f, "prepare log {} is not open", path.display())
            }
            PrepareLogError::InUse { path } => write!(
                f,
                "prepare log {}: a planned write or sync has not completed",
                path.display()
            ),
        }
    }
}

impl std::error::Error for PrepareLogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PrepareLogError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// An IO call's error on `path` (glommio's keep their OS code: `IntoIoError`).
fn io<'a, E: IntoIoError>(op: &'static str, path: &'a Path) -> impl Fn(E) -> PrepareLogError + 'a {
    move |e| PrepareLogError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into_io_error(),
    }
}

impl PrepareLog {
    /// Opens (creating if absent) the prepare log in `dir`, drops a damaged or unchained
    /// tail, and returns the records it holds.
    pub async fn open(dir: &Path) -> Result<(PrepareLog, Vec<Record>), PrepareLogError> {
        let path = dir.join(PREPARES_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io("read", &path)(e)),
        };
        let mut records: Vec<Record> = Vec::new();
        let mut entries = VecDeque::new();
        let mut at = 0usize;
        while let Some((record, len)) = Record::decode(&bytes[at..]) {
            if let Some(below) = records.last() {
                let chained = record.op() == below.op() + 1
                    && record.header.parent == below.header.frame.checksum
                    && record.base_offset == below.next_offset;
                if !chained {
                    break;
                }
            }
            if record.next_offset < record.base_offset {
                break;
            }
            entries.push_back(entry_of(&record, at as u64));
            records.push(record);
            at += len;
        }
        if at < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                kept = at,
                dropped = bytes.len() - at,
                "prepare log: unacknowledged or damaged tail dropped"
            );
            truncate_closed(&path, at as u64)?;
        }
        let log = PrepareLog {
            path,
            file: None,
            last_write: Instant::now(),
            entries,
            end: at as u64,
        };
        Ok((log, records))
    }

    /// Whether the file is open (records may be written).
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Opens the file (creating it if absent) for `plan_many`; the other writes open it
    /// themselves.
    pub async fn open_for_writes(&mut self) -> Result<(), PrepareLogError> {
        if self.file.is_none() {
            self.file = Some(Rc::new(open_file(&self.path).await?));
            self.last_write = Instant::now();
        }
        Ok(())
    }

    /// Syncs and closes the file if no record was written for `idle` and no planned
    /// write or sync holds it. Returns whether the file is closed now.
    pub async fn close_idle(&mut self, idle: Duration) -> Result<bool, PrepareLogError> {
        let Some(file) = &self.file else {
            return Ok(true);
        };
        if self.last_write.elapsed() < idle || Rc::strong_count(file) > 1 {
            return Ok(false);
        }
        self.sync().await?;
        let file = match self.file.take().map(Rc::try_unwrap) {
            Some(Ok(file)) => file,
            // Shared again while it synced: it stays open.
            Some(Err(shared)) => {
                self.file = Some(shared);
                return Ok(false);
            }
            None => return Ok(true),
        };
        file.close().await.map_err(io("close", &self.path))?;
        Ok(true)
    }

    /// When a record was last written (or the file opened), while the file is open.
    pub fn open_since_write(&self) -> Option<Instant> {
        self.file.as_ref().map(|_| self.last_write)
    }

    /// The open file, for a write.
    fn file(&self) -> Result<&Rc<BufferedFile>, PrepareLogError> {
        self.file.as_ref().ok_or_else(|| PrepareLogError::NotOpen {
            path: self.path.clone(),
        })
    }

    /// The highest op recorded (0 when empty).
    pub fn head(&self) -> u64 {
        self.entries.back().map_or(0, |e| e.op)
    }

    /// The record of `op`, if held.
    pub fn get(&self, op: u64) -> Option<&Entry> {
        let first = self.entries.front()?.op;
        self.entries
            .get(usize::try_from(op.checked_sub(first)?).ok()?)
    }

    /// Reads the durable record of `op` back from the file (a read of one record, on
    /// the calling thread): for a prepare that left memory.
    pub fn read_record(&self, op: u64) -> Result<Record, PrepareLogError> {
        use std::os::unix::fs::FileExt;
        let entry = self.get(op).ok_or(PrepareLogError::NoRecord { op })?;
        let len = (self.end.saturating_sub(entry.position))
            .min((FIXED_LEN + INLINE_BODY_MAX + 8) as u64) as usize;
        let mut bytes = vec![0; len];
        std::fs::File::open(&self.path)
            .and_then(|file| file.read_exact_at(&mut bytes, entry.position))
            .map_err(io("read", &self.path))?;
        match Record::decode(&bytes) {
            Some((record, _))
                if record.op() == op && record.header.frame.checksum == entry.identity =>
            {
                Ok(record)
            }
            _ => Err(PrepareLogError::Corrupt {
                path: self.path.clone(),
                op: Some(op),
                reason: "is damaged",
            }),
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of memory the in-memory index of records holds (its capacity: it grows to
    /// the records kept between compactions and keeps that room).
    pub fn memory_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// Appends the record of the next op (not synced: call `sync` per the durability
    /// policy).
    pub async fn append(&mut self, record: &Record) -> Result<(), PrepareLogError> {
        self.append_many(std::slice::from_ref(record)).await
    }

    /// Appends the records of the next ops in one write (a group commit's records), not
    /// synced. They must follow the log and each other.
    pub async fn append_many(&mut self, records: &[Record]) -> Result<(), PrepareLogError> {
        let (bytes, entries) = self.encode_many(records)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let len = bytes.len() as u64;
        self.open_for_writes().await?;
        write_records(self.file()?, &self.path, bytes, self.end).await?;
        self.last_write = Instant::now();
        self.entries.extend(entries);
        self.end += len;
        Ok(())
    }

    /// As `append_many`, without writing: the log counts the records at once and the
    /// caller runs the returned write (it holds the file, not the log), which must
    /// complete before the records are synced, truncated or compacted. The file must be
    /// open (`open_for_writes`).
    pub fn plan_many(&mut self, records: &[Record]) -> Result<PlannedRecords, PrepareLogError> {
        let file = self.file()?.clone();
        let (bytes, entries) = self.encode_many(records)?;
        self.last_write = Instant::now();
        let planned = PlannedRecords {
            file,
            path: self.path.clone(),
            at: self.end,
            bytes,
        };
        self.end += planned.bytes.len() as u64;
        self.entries.extend(entries);
        Ok(planned)
    }

    /// An fdatasync of the records that holds only the file (nothing to do while it is
    /// closed: it closes synced).
    pub fn syncer(
        &self,
    ) -> impl std::future::Future<Output = Result<(), PrepareLogError>> + 'static {
        let (file, path) = (self.file.clone(), self.path.clone());
        async move {
            let Some(file) = file else {
                return Ok(());
            };
            file.fdatasync().await.map_err(io("fdatasync", &path))
        }
    }

    /// The bytes and index entries of `records` appended after the log's end.
    fn encode_many(&self, records: &[Record]) -> Result<(Vec<u8>, Vec<Entry>), PrepareLogError> {
        let mut expected = self.head() + 1;
        let mut bytes = Vec::new();
        let mut entries = Vec::with_capacity(records.len());
        for (i, record) in records.iter().enumerate() {
            if (!self.entries.is_empty() || i > 0) && record.op() != expected {
                return Err(PrepareLogError::OutOfOrder {
                    op: record.op(),
                    after: expected - 1,
                });
            }
            expected = record.op() + 1;
            entries.push(entry_of(record, self.end + bytes.len() as u64));
            bytes.extend_from_slice(&record.encode());
        }
        Ok((bytes, entries))
    }

    /// Forces every record appended so far to stable storage (a closed file was synced
    /// when it closed).
    pub async fn sync(&mut self) -> Result<(), PrepareLogError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        file.fdatasync().await.map_err(io("fdatasync", &self.path))
    }

    /// Drops every record above `op_max` (durably).
    pub async fn truncate_after(&mut self, op_max: u64) -> Result<(), PrepareLogError> {
        let Some(cut) = self.get(op_max + 1).map(|e| e.position).or_else(|| {
            // Everything is above op_max.
            self.entries
                .front()
                .filter(|e| e.op > op_max)
                .map(|e| e.position)
        }) else {
            return Ok(());
        };
        // A closed file is cut without opening it for good: it stays closed (only a
        // lane's write opens it, and the node closes what a lane opened).
        match &self.file {
            Some(file) => {
                file.truncate(cut)
                    .await
                    .map_err(io("truncate", &self.path))?;
                self.sync().await?;
            }
            None => truncate_closed(&self.path, cut)?,
        }
        while self.entries.back().is_some_and(|e| e.op > op_max) {
            self.entries.pop_back();
        }
        self.end = cut;
        Ok(())
    }

    /// Rewrites the file without the records below `keep_from` (they are in a durable
    /// checkpoint now): a new file is written, synced and renamed over the old one.
    pub async fn compact(&mut self, keep_from: u64) -> Result<(), PrepareLogError> {
        let Some(first) = self.get(keep_from).map(|e| e.position) else {
            return Ok(());
        };
        if first == 0 {
            return Ok(());
        }
        self.sync().await?;
        let bytes = std::fs::read(&self.path).map_err(io("read", &self.path))?;
        let tail = bytes
            .get(first as usize..self.end as usize)
            .ok_or_else(|| PrepareLogError::Corrupt {
                path: self.path.clone(),
                op: None,
                reason: "is shorter than expected",
            })?;
        let temp = self.path.with_extension("tmp");
        let written = std::fs::File::create(&temp)
            .map_err(io("create", &temp))
            .and_then(|mut file| {
                file.write_all(tail).map_err(io("write", &temp))?;
                file.sync_all().map_err(io("fsync", &temp))
            });
        if let Err(error) = written {
            // The log is unchanged (a full disk, say): the partial copy goes.
            let _ = std::fs::remove_file(&temp);
            return Err(error);
        }
        std::fs::rename(&temp, &self.path).map_err(io("rename", &self.path))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io("fsync", dir))?;
        }
        // An open file goes on with the new one; a closed one stays closed.
        if let Some(old) = self.file.take() {
            self.file = Some(Rc::new(open_file(&self.path).await?));
            if let Ok(old) = Rc::try_unwrap(old) {
                let _ = old.close().await;
            }
        }
        while self.entries.front().is_some_and(|e| e.op < keep_from) {
            self.entries.pop_front();
        }
        for entry in &mut self.entries {
            entry.position -= first;
        }
        self.end -= first;
        Ok(())
    }

    /// Syncs and closes.
    pub async fn close(mut self) -> Result<(), PrepareLogError> {
        self.sync().await?;
        let Some(file) = self.file else {
            return Ok(());
        };
        let Ok(file) = Rc::try_unwrap(file) else {
            return Err(PrepareLogError::InUse { path: self.path });
        };
        file.close().await.map_err(io("close", &self.path))
    }
}

/// Records planned by `PrepareLog::plan_many`, to be written.
pub struct PlannedRecords {
    file: Rc<BufferedFile>,
    path: PathBuf,
    at: u64,
    bytes: Vec<u8>,
}

impl PlannedRecords {
    pub async fn run(self) -> Result<(), PrepareLogError> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        write_records(&self.file, &self.path, self.bytes, self.at).await
    }
}

async fn write_records(
    file: &BufferedFile,
    path: &Path,
    bytes: Vec<u8>,
    at: u64,
) -> Result<(), PrepareLogError> {
    let len = bytes.len();
    let written = file.write_at(bytes, at).await.map_err(io("write", path))?;
    if written != len {
        return Err(io("write", path)(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!("short write {written} of {len}"),
        )));
    }
    Ok(())
}

/// Cuts the prepare log file at `len` durably, through a descriptor of its own.
fn truncate_closed(path: &Path, len: u64) -> Result<(), PrepareLogError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io("open", path))?;
    file.set_len(len).map_err(io("truncate", path))?;
    file.sync_all().map_err(io("fsync", path))
}

/// Makes an empty prepare log in a new partition's folder, not synced: the caller syncs
/// the folder. An existing file is left as it is.
pub fn create_empty(dir: &Path) -> Result<(), PrepareLogError> {
    let path = dir.join(PREPARES_FILE);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io("create", &path)(e)),
    }
}

fn entry_of(record: &Record, position: u64) -> Entry {
    Entry {
        op: record.op(),
        identity: record.header.frame.checksum,
        base_offset: record.base_offset,
        next_offset: record.next_offset,
        last_timestamp: record.last_timestamp,
        position,
    }
}

async fn open_file(path: &Path) -> Result<BufferedFile, PrepareLogError> {
    let existed = path.exists();
    let file = glommio::io::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .buffered_open(path)
        .await
        .map_err(io("open", path))?;
    if !existed {
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io("fsync", dir))?;
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests;
