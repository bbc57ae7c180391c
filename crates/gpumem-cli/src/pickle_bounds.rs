//! Reading a pickle within bounds, before [`crate::pickle_values`] decodes it.
//!
//! A decoder that builds, clones, converts and drops values recursively has
//! a depth limit in the stack: a pickle of lists nested 200,000 deep (400 KB)
//! would overflow it and abort the process. [`read`] walks the pickle's
//! opcodes (protocols 0 to 5) without building anything, and tracks how deep
//! every value nests, references to memoized values included (they are
//! followed once the pickle has ended, so a value's depth is the longest path
//! through them). It refuses, with an error naming the byte, a pickle that
//! nests deeper than [`Limits::max_depth`], that is larger than
//! [`Limits::max_bytes`] or does not end (`/dev/zero`), that refers to itself,
//! or that the decoder could not read anyway. What it accepts, the decoder
//! reads with a bounded recursion.
//!
//! A snapshot keys its dicts by text and integers and has no sets, so
//! [`read`] refuses a float in a key, any set, and a call (REDUCE, how
//! `set([...])` pickles) on floats: what no snapshot holds, and what other
//! readers (serde-pickle sorts keys and set members) may panic on.

use std::collections::HashMap;
use std::io::{BufRead, Read};

use anyhow::{anyhow, bail, Result};

/// What [`read`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of containers. PyTorch's snapshots nest about 8 deep.
    pub max_depth: u32,
    /// Largest pickle, in bytes.
    pub max_bytes: u64,
}

impl Default for Limits {
    /// 100 levels (a recursive decoder in a debug build goes a few hundred
    /// deep on a 2 MiB thread, and the main thread has 8 MiB), 4 GiB.
    fn default() -> Self {
        Self {
            max_depth: 100,
            max_bytes: 4 << 30,
        }
    }
}

/// A value on the pickle machine's stack or in its memo, as far as depth goes.
#[derive(Debug, Clone, Default)]
struct Node {
    /// How deep it nests in itself: 0 for a scalar (which stays one: adding
    /// to it is an error), 1 for `[]` or `[1]`.
    depth: u32,
    /// The memo entries it refers to, each with how deep inside it the
    /// reference sits.
    refs: Vec<(u32, u32)>,
    /// It is or holds a float (as it was when it was taken in: what can
    /// change later, a list or a dict, is no dict key either way).
    float: bool,
}

/// A stack slot: a value, or a reference to a memo entry (which later
/// changes to the entry reach).
#[derive(Debug, Clone)]
enum Slot {
    Value(Node),
    Memo(u32),
}

/// The pickle machine, reduced to depths.
struct Machine<'a, R> {
    input: R,
    /// The bytes read so far, when the caller keeps them.
    kept: Option<&'a mut Vec<u8>>,
    /// Bytes read so far.
    pos: u64,
    /// Where the opcode being run starts, for errors.
    op_at: u64,
    limits: Limits,
    stack: Vec<Slot>,
    marks: Vec<Vec<Slot>>,
    memo: HashMap<u32, Node>,
}

/// Reads one pickle from `input`, up to its STOP opcode, checking it against
/// `limits`, and returns its bytes for the decoder.
pub fn read<R: BufRead>(input: R, limits: Limits) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    Machine::new(input, Some(&mut bytes), limits).run()?;
    Ok(bytes)
}

/// Checks a pickle held in memory against `limits`.
pub fn check(bytes: &[u8], limits: Limits) -> Result<()> {
    Machine::new(bytes, None, limits).run()
}

impl<'a, R: BufRead> Machine<'a, R> {
    fn new(input: R, kept: Option<&'a mut Vec<u8>>, limits: Limits) -> Self {
        Self {
            input,
            kept,
            pos: 0,
            op_at: 0,
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn fail<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        bail!("byte {}: {what}", self.op_at)
    }

    /// Accounts for `n` more bytes, failing past the size limit.
    fn advance(&mut self, n: u64) -> Result<()> {
        self.pos += n;
        if self.pos > self.limits.max_bytes {
            bail!(
                "larger than {} bytes (the most a snapshot may have)",
                self.limits.max_bytes
            );
        }
        Ok(())
    }

    fn byte(&mut self) -> Result<u8> {
        let Some(&b) = self.input.fill_buf()?.first() else {
            return self.fail("the pickle ends early");
        };
        self.input.consume(1);
        self.advance(1)?;
        if let Some(k) = self.kept.as_mut() {
            k.push(b);
        }
        Ok(b)
    }

    /// Skips (keeps, when asked) exactly `n` bytes, without taking memory for
    /// a length the input does not have.
    fn skip(&mut self, n: u64) -> Result<()> {
        if self.pos.saturating_add(n) > self.limits.max_bytes {
            return self.fail(format_args!(
                "a length of {n} bytes takes the pickle past {} bytes",
                self.limits.max_bytes
            ));
        }
        let mut part = (&mut self.input).take(n);
        let got = match self.kept.as_mut() {
            Some(k) => part.read_to_end(k)? as u64,
            None => std::io::copy(&mut part, &mut std::io::sink())?,
        };
        if got != n {
            return self.fail("the pickle ends early");
        }
        self.advance(n)
    }

    /// A little-endian number of `n` bytes.
    fn le(&mut self, n: u32) -> Result<u64> {
        let mut v = 0;
        for i in 0..n {
            v |= u64::from(self.byte()?) << (8 * i);
        }
        Ok(v)
    }

    /// A line argument, up to and without its line break.
    fn line(&mut self) -> Result<Vec<u8>> {
        let room = self.limits.max_bytes - self.pos;
        let mut buf = Vec::new();
        (&mut self.input)
            .take(room.saturating_add(1))
            .read_until(b'\n', &mut buf)?;
        if buf.last() != Some(&b'\n') {
            // Past the size limit, that is the error; else the input ended.
            self.advance(buf.len() as u64)?;
            return self.fail("the pickle ends early (a line argument has no end)");
        }
        self.advance(buf.len() as u64)?;
        if let Some(k) = self.kept.as_mut() {
            k.extend_from_slice(&buf);
        }
        buf.pop();
        Ok(buf)
    }

    fn memo_id_line(&mut self) -> Result<u32> {
        let line = self.line()?;
        match std::str::from_utf8(&line)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            Some(id) => Ok(id),
            None => self.fail("a memo index that is not a number"),
        }
    }

    fn push(&mut self, node: Node) {
        self.stack.push(Slot::Value(node));
    }

    fn pop(&mut self) -> Result<Slot> {
        match self.stack.pop() {
            Some(s) => Ok(s),
            None => self.fail("the pickle's stack runs empty"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Slot>> {
        match self.marks.pop() {
            Some(below) => Ok(std::mem::replace(&mut self.stack, below)),
            None => self.fail("no mark to pop to"),
        }
    }

    /// The value behind a slot (a memo entry's as it is now).
    fn resolve(&self, slot: Slot) -> Result<Node> {
        match slot {
            Slot::Value(n) => Ok(n),
            Slot::Memo(id) => match self.memo.get(&id) {
                Some(n) => Ok(n.clone()),
                None => self.fail(format_args!("memo entry {id} is not defined")),
            },
        }
    }

    /// Whether the value behind `slot` is or holds a float.
    fn holds_float(&self, slot: &Slot) -> bool {
        match slot {
            Slot::Value(n) => n.float,
            Slot::Memo(id) => self.memo.get(id).is_some_and(|n| n.float),
        }
    }

    /// Refuses dict keys (every other item of `items`, from the first) that
    /// are or hold a float.
    fn check_keys(&self, items: &[Slot]) -> Result<()> {
        if items.iter().step_by(2).any(|k| self.holds_float(k)) {
            return self.fail("a dict key that is or holds a float (not a memory snapshot)");
        }
        Ok(())
    }

    /// Puts `items` inside `node`, one level down.
    fn fill(&self, node: &mut Node, items: Vec<Slot>) -> Result<()> {
        for item in items {
            node.float |= self.holds_float(&item);
            match item {
                Slot::Memo(id) => {
                    node.depth = node.depth.max(1);
                    // A scalar's entry (a dict key, a file name) stays a
                    // scalar: no need to follow it.
                    if self.memo.get(&id).is_some_and(|n| n.depth > 0) {
                        node.refs.push((id, 1));
                    }
                }
                Slot::Value(v) => {
                    node.depth = node.depth.max(v.depth + 1);
                    node.refs
                        .extend(v.refs.into_iter().map(|(id, at)| (id, at + 1)));
                }
            }
        }
        if node.depth > self.limits.max_depth {
            return self.fail(format_args!(
                "nested deeper than {} levels (not a memory snapshot)",
                self.limits.max_depth
            ));
        }
        Ok(())
    }

    /// A new container holding `items`.
    fn build(&mut self, items: Vec<Slot>) -> Result<()> {
        let mut node = Node {
            depth: 1,
            ..Node::default()
        };
        self.fill(&mut node, items)?;
        self.push(node);
        Ok(())
    }

    /// Adds `items` to the container on top of the stack (the memo entry,
    /// when the top refers to one).
    fn extend_top(&mut self, items: Vec<Slot>) -> Result<()> {
        let mut added = Node::default();
        self.fill(&mut added, items)?;
        let target = match self.stack.last_mut() {
            Some(Slot::Value(n)) => Some(n),
            Some(Slot::Memo(id)) => {
                let id = *id;
                self.memo.get_mut(&id)
            }
            None => return self.fail("the pickle's stack runs empty"),
        };
        match target {
            Some(n) if n.depth > 0 => {
                n.depth = n.depth.max(added.depth);
                n.refs.extend(added.refs);
                n.float |= added.float;
                Ok(())
            }
            _ => self.fail("adding items to something that is not a container"),
        }
    }

    fn memoize(&mut self, id: u32) -> Result<()> {
        // Python's pickler never stores twice under one index; refusing it
        // keeps every reference meaning what it meant when it was taken.
        if self.memo.contains_key(&id) {
            return self.fail(format_args!("memo entry {id} is stored twice"));
        }
        let slot = self.pop()?;
        let node = self.resolve(slot)?;
        self.memo.insert(id, node);
        self.stack.push(Slot::Memo(id));
        Ok(())
    }

    fn get(&mut self, id: u32) -> Result<()> {
        if !self.memo.contains_key(&id) {
            return self.fail(format_args!("memo entry {id} is not defined"));
        }
        self.stack.push(Slot::Memo(id));
        Ok(())
    }

    fn pop_n(&mut self, n: usize) -> Result<Vec<Slot>> {
        let mut items = (0..n).map(|_| self.pop()).collect::<Result<Vec<_>>>()?;
        items.reverse();
        Ok(items)
    }

    fn run(mut self) -> Result<()> {
        let scalar = Node::default;
        let empty = || Node {
            depth: 1,
            ..Node::default()
        };
        loop {
            self.op_at = self.pos;
            let op = self.byte()?;
            match op {
                b'\x80' => drop(self.byte()?), // PROTO
                b'\x95' => self.skip(8)?,      // FRAME
                b'.' => return self.stop(),    // STOP
                b'(' => {
                    // MARK
                    let above = std::mem::take(&mut self.stack);
                    self.marks.push(above);
                }
                b'0' => {
                    // POP: an empty stack pops its mark, as the decoder does.
                    if self.stack.is_empty() {
                        self.pop_mark()?;
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => drop(self.pop_mark()?), // POP_MARK
                b'2' => {
                    // DUP: a copy of the top's value, even behind a reference.
                    let top = match self.stack.last() {
                        Some(s) => s.clone(),
                        None => return self.fail("the pickle's stack runs empty"),
                    };
                    let node = self.resolve(top)?;
                    self.push(node);
                }
                b'p' => {
                    let id = self.memo_id_line()?; // PUT
                    self.memoize(id)?;
                }
                b'q' => {
                    let id = self.byte()?; // BINPUT
                    self.memoize(id.into())?;
                }
                b'r' => {
                    let id = self.le(4)? as u32; // LONG_BINPUT
                    self.memoize(id)?;
                }
                b'\x94' => self.memoize(self.memo.len() as u32)?, // MEMOIZE
                b'g' => {
                    let id = self.memo_id_line()?; // GET
                    self.get(id)?;
                }
                b'h' => {
                    let id = self.byte()?; // BINGET
                    self.get(id.into())?;
                }
                b'j' => {
                    let id = self.le(4)? as u32; // LONG_BINGET
                    self.get(id)?;
                }
                // NONE, NEWTRUE, NEWFALSE
                b'N' | b'\x88' | b'\x89' => self.push(scalar()),
                // INT, LONG, FLOAT, STRING, UNICODE: a line each
                b'I' | b'L' | b'F' | b'S' | b'V' => {
                    self.line()?;
                    self.push(Node {
                        float: op == b'F',
                        ..scalar()
                    });
                }
                // BININT1, BININT2, BININT, BINFLOAT
                b'K' | b'M' | b'J' | b'G' => {
                    self.skip(match op {
                        b'K' => 1,
                        b'M' => 2,
                        b'J' => 4,
                        _ => 8,
                    })?;
                    self.push(Node {
                        float: op == b'G',
                        ..scalar()
                    });
                }
                // LONG1, SHORT_BINBYTES, SHORT_BINSTRING, SHORT_BINUNICODE:
                // a 1-byte length
                b'\x8a' | b'C' | b'U' | b'\x8c' => {
                    let n = self.le(1)?;
                    self.skip(n)?;
                    self.push(scalar());
                }
                // LONG4, BINSTRING: a signed 4-byte length
                b'\x8b' | b'T' => {
                    let n = self.le(4)? as u32 as i32;
                    if n < 0 {
                        return self.fail("a negative length");
                    }
                    self.skip(n as u64)?;
                    self.push(scalar());
                }
                // BINBYTES, BINUNICODE: a 4-byte length
                b'B' | b'X' => {
                    let n = self.le(4)?;
                    self.skip(n)?;
                    self.push(scalar());
                }
                // BINBYTES8, BINUNICODE8, BYTEARRAY8: an 8-byte length
                b'\x8e' | b'\x8d' | b'\x96' => {
                    let n = self.le(8)?;
                    self.skip(n)?;
                    self.push(scalar());
                }
                // EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT
                b')' | b']' | b'}' => self.push(empty()),
                // EMPTY_SET, ADDITEMS, FROZENSET
                b'\x8f' | b'\x90' | b'\x91' => {
                    return self.fail("a set (a memory snapshot has none)")
                }
                b'\x85' | b'\x86' | b'\x87' => {
                    // TUPLE1, TUPLE2, TUPLE3
                    let items = self.pop_n(usize::from(op - b'\x84'))?;
                    self.build(items)?;
                }
                // TUPLE, LIST, DICT: the items above the mark
                b't' | b'l' | b'd' => {
                    let items = self.pop_mark()?;
                    if op == b'd' {
                        self.check_keys(&items)?;
                    }
                    self.build(items)?;
                }
                b'a' => {
                    let item = self.pop()?; // APPEND
                    self.extend_top(vec![item])?;
                }
                b's' => {
                    let items = self.pop_n(2)?; // SETITEM
                    self.check_keys(&items)?;
                    self.extend_top(items)?;
                }
                // APPENDS, SETITEMS
                b'e' | b'u' => {
                    let items = self.pop_mark()?;
                    if op == b'u' {
                        self.check_keys(&items)?;
                    }
                    self.extend_top(items)?;
                }
                b'c' => {
                    self.line()?; // GLOBAL: module and name lines
                    self.line()?;
                    self.push(scalar());
                }
                b'\x93' => {
                    self.pop_n(2)?; // STACK_GLOBAL
                    self.push(scalar());
                }
                b'R' => {
                    // REDUCE: the decoder keeps at most what the argument
                    // tuple holds; count the tuple itself, to be safe.
                    let args = self.pop()?;
                    let args = self.resolve(args)?;
                    if args.float {
                        return self.fail("a call on floats (a memory snapshot makes no calls)");
                    }
                    self.pop()?;
                    self.push(args);
                }
                b'b' => {
                    // BUILD: the state replaces the object.
                    let state = self.pop()?;
                    self.pop()?;
                    self.stack.push(state);
                }
                b'\x81' => {
                    self.pop_n(2)?; // NEWOBJ: an empty dict stands in
                    self.push(empty());
                }
                b'\x92' => {
                    self.pop_n(3)?; // NEWOBJ_EX
                    self.push(empty());
                }
                b'o' => {
                    self.pop_mark()?; // OBJ
                    self.pop()?;
                    self.push(empty());
                }
                b'i' => {
                    self.line()?; // INST
                    self.line()?;
                    self.pop_mark()?;
                    self.push(empty());
                }
                other => {
                    return self.fail(format_args!(
                        "opcode {other:#04x} is not one a snapshot is read with"
                    ))
                }
            }
        }
    }

    /// STOP: the result's depth through the memo entries it refers to, and
    /// nothing after the pickle's end.
    fn stop(mut self) -> Result<()> {
        let top = self.pop()?;
        let root = match top {
            Slot::Value(n) => n,
            Slot::Memo(id) => Node {
                refs: vec![(id, 0)],
                ..Node::default()
            },
        };
        let depth = self.resolved_depth(&root)?;
        if depth > self.limits.max_depth {
            return self.fail(format_args!(
                "nested deeper than {} levels (not a memory snapshot)",
                self.limits.max_depth
            ));
        }
        let mut rest = [0u8; 1];
        if self.input.read(&mut rest)? != 0 {
            return self.fail("bytes after the pickle's end");
        }
        Ok(())
    }

    /// The longest path from `root` through the memo entries it refers to
    /// (depth-first without recursion); an error on a cycle or past the limit.
    fn resolved_depth(&self, root: &Node) -> Result<u32> {
        let too_deep = || {
            anyhow!(
                "byte {}: nested deeper than {} levels (not a memory snapshot)",
                self.op_at,
                self.limits.max_depth
            )
        };
        let mut done: HashMap<u32, u32> = HashMap::new();
        let mut path: Vec<(u32, usize)> = Vec::new();
        let depth_of = |node: &Node, done: &HashMap<u32, u32>| {
            node.refs
                .iter()
                .map(|(id, at)| at + done[id])
                .fold(node.depth, u32::max)
        };
        for &(start, _) in &root.refs {
            if done.contains_key(&start) {
                continue;
            }
            path.push((start, 0));
            while let Some((id, next)) = path.last().copied() {
                let node = &self.memo[&id];
                if let Some(&(child, _)) = node.refs.get(next) {
                    path.last_mut().expect("not empty").1 += 1;
                    if done.contains_key(&child) {
                        continue;
                    }
                    // Each reference on the path nests one level at least,
                    // so the path is short unless the pickle is too deep.
                    if path.len() as u32 >= self.limits.max_depth {
                        return Err(too_deep());
                    }
                    if path.iter().any(|&(p, _)| p == child) {
                        bail!("byte {}: the pickle refers to itself", self.op_at);
                    }
                    path.push((child, 0));
                } else {
                    let d = depth_of(node, &done);
                    if d > self.limits.max_depth {
                        return Err(too_deep());
                    }
                    done.insert(id, d);
                    path.pop();
                }
            }
        }
        Ok(depth_of(root, &done))
    }
}
