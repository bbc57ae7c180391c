//! Decoding a pickle into [`Value`]s that share what the pickle shares.
//!
//! Python's pickler writes an object held in several places once and refers
//! to it afterwards through its memo. PyTorch's memory snapshots share each
//! stack's list of frames, and each frame, between the events and blocks
//! that have them: a snapshot of 200,000 events with 30 frames each holds
//! a few thousand frames. serde-pickle cannot read such a pickle (its count
//! of memo references misses those inside a clone, and it fails with
//! "recursive structure found"), and a decoder that copied each shared value
//! into every place would make millions of values of it. This decoder runs
//! the pickle machine over bytes that [`pickle_bounds`](crate::pickle_bounds)
//! has accepted (bounded depth and size, no cycles) and keeps one value per
//! memo entry, reference-counted: what the decoded value holds is about
//! what the pickle holds.
//!
//! What it reads as serde-pickle does: Python 2 strings (`S`, `T`, `U`) as
//! bytes, an object built by a class (`NEWOBJ`, `OBJ`, `INST`) as its state
//! (what `BUILD` gives it) or an empty dict, and any other call (`REDUCE`)
//! on a global as `None`, except `collections.OrderedDict` (a dict) and
//! `_codecs.encode` (bytes, how protocol 2 writes them). A dict keeps its
//! items in the pickle's order (keys need no order).

use std::collections::HashMap;
use std::rc::Rc;

use anyhow::{anyhow, bail, Result};
use num_bigint::BigInt;

/// A decoded pickle value. Containers and texts are reference-counted: a
/// value the pickle shares is one value here too, and cloning is cheap.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An integer that fits 64 bits.
    I64(i64),
    /// A larger integer.
    Int(BigInt),
    /// A float.
    F64(f64),
    /// `bytes`, `bytearray` or a Python 2 string.
    Bytes(Rc<[u8]>),
    /// A `str`.
    String(Rc<str>),
    /// A list.
    List(Rc<[Value]>),
    /// A tuple.
    Tuple(Rc<[Value]>),
    /// A dict, its items in the pickle's order.
    Dict(Rc<[(Value, Value)]>),
}

impl Value {
    /// The text of a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A value as the machine builds it: containers may hold references to
/// memo entries, which are followed once the pickle has ended (an entry can
/// change after a reference to it was taken, as in Python).
#[derive(Debug, Clone)]
enum Node {
    Scalar(Value),
    List(Vec<Node>),
    Tuple(Vec<Node>),
    Dict(Vec<(Node, Node)>),
    Memo(u32),
    /// A class or function named by `GLOBAL` or `STACK_GLOBAL`.
    Global(String, String),
}

struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Where the opcode being run starts, for errors.
    op_at: usize,
    stack: Vec<Node>,
    marks: Vec<Vec<Node>>,
    memo: HashMap<u32, Node>,
}

/// Decodes one pickle that [`pickle_bounds::check`](crate::pickle_bounds::check)
/// accepted (its depth bound keeps the recursion here shallow, and its
/// cycle check makes every reference end).
pub fn decode(bytes: &[u8]) -> Result<Value> {
    let (root, memo) = Decoder {
        bytes,
        pos: 0,
        op_at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    }
    .run()?;
    Output {
        memo: &memo,
        done: HashMap::new(),
        visiting: Vec::new(),
    }
    .value(&root)
}

/// The second pass: nodes to values, the value of each memo entry made once
/// and shared by every place that refers to it.
struct Output<'m> {
    memo: &'m HashMap<u32, Node>,
    done: HashMap<u32, Value>,
    /// The entries being made (a cycle check, should one slip through).
    visiting: Vec<u32>,
}

impl Output<'_> {
    fn all(&mut self, nodes: &[Node]) -> Result<Rc<[Value]>> {
        nodes.iter().map(|n| self.value(n)).collect()
    }

    fn value(&mut self, node: &Node) -> Result<Value> {
        Ok(match node {
            Node::Scalar(v) => v.clone(),
            Node::Global(..) => Value::None,
            Node::List(items) => Value::List(self.all(items)?),
            Node::Tuple(items) => Value::Tuple(self.all(items)?),
            Node::Dict(pairs) => Value::Dict(
                pairs
                    .iter()
                    .map(|(k, v)| Ok((self.value(k)?, self.value(v)?)))
                    .collect::<Result<_>>()?,
            ),
            Node::Memo(id) => {
                if let Some(v) = self.done.get(id) {
                    return Ok(v.clone());
                }
                if self.visiting.contains(id) {
                    bail!("the pickle refers to itself");
                }
                let memo = self.memo;
                let Some(entry) = memo.get(id) else {
                    bail!("memo entry {id} is not defined");
                };
                self.visiting.push(*id);
                let v = self.value(entry)?;
                self.visiting.pop();
                self.done.insert(*id, v.clone());
                v
            }
        })
    }
}

impl Decoder<'_> {
    fn fail<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        bail!("byte {}: {what}", self.op_at)
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        match self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
        {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => bail!("byte {}: the pickle ends early", self.op_at),
        }
    }

    fn le(&mut self, n: usize) -> Result<u64> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0, |v, &x| v << 8 | u64::from(x)))
    }

    /// A length argument of `n` bytes, as an index.
    fn len(&mut self, n: usize) -> Result<usize> {
        let v = self.le(n)?;
        usize::try_from(v).or_else(|_| self.fail("a length past the address space"))
    }

    fn line(&mut self) -> Result<String> {
        let rest = &self.bytes[self.pos..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return self.fail("the pickle ends early (a line argument has no end)");
        };
        let line = String::from_utf8_lossy(&rest[..end]).into_owned();
        self.pos += end + 1;
        Ok(line)
    }

    fn memo_id_line(&mut self) -> Result<u32> {
        let line = self.line()?;
        line.trim()
            .parse()
            .or_else(|_| self.fail("a memo index that is not a number"))
    }

    fn push(&mut self, v: Value) {
        self.stack.push(Node::Scalar(v));
    }

    fn pop(&mut self) -> Result<Node> {
        match self.stack.pop() {
            Some(s) => Ok(s),
            None => self.fail("the pickle's stack runs empty"),
        }
    }

    fn pop_n(&mut self, n: usize) -> Result<Vec<Node>> {
        let mut items = (0..n).map(|_| self.pop()).collect::<Result<Vec<_>>>()?;
        items.reverse();
        Ok(items)
    }

    fn pop_mark(&mut self) -> Result<Vec<Node>> {
        match self.marks.pop() {
            Some(below) => Ok(std::mem::replace(&mut self.stack, below)),
            None => self.fail("no mark to pop to"),
        }
    }

    /// The node behind a memo reference (one level), as it is now.
    fn deref<'n>(&'n self, node: &'n Node) -> &'n Node {
        self.entry(node)
            .and_then(|id| self.memo.get(&id))
            .unwrap_or(node)
    }

    /// The memo entry `node` refers to, through references memoized again
    /// (a chain never longer than the memo).
    fn entry(&self, node: &Node) -> Option<u32> {
        let Node::Memo(mut id) = node else {
            return None;
        };
        for _ in 0..self.memo.len() {
            match self.memo.get(&id) {
                Some(Node::Memo(next)) => id = *next,
                _ => break,
            }
        }
        Some(id)
    }

    /// Adds `items` to the list or dict on top of the stack (the memo
    /// entry, when the top refers to one).
    fn extend_top(&mut self, items: Vec<Node>) -> Result<()> {
        let at = self.op_at;
        let Some(top) = self.stack.last() else {
            bail!("byte {at}: the pickle's stack runs empty");
        };
        let target = match self.entry(top) {
            Some(id) => self.memo.get_mut(&id),
            None => self.stack.last_mut(),
        };
        match target {
            Some(Node::List(l)) => l.extend(items),
            Some(Node::Dict(d)) => d.extend(pairs(at, items)?),
            _ => bail!("byte {at}: adding items to something that is not a container"),
        }
        Ok(())
    }

    fn memoize(&mut self, id: u32) -> Result<()> {
        if self.memo.contains_key(&id) {
            return self.fail(format_args!("memo entry {id} is stored twice"));
        }
        let node = self.pop()?;
        // A reference memoized again (Python never writes it) is the same
        // object: the new entry refers to the old one.
        self.memo.insert(id, node);
        self.stack.push(Node::Memo(id));
        Ok(())
    }

    fn get(&mut self, id: u32) -> Result<()> {
        if !self.memo.contains_key(&id) {
            return self.fail(format_args!("memo entry {id} is not defined"));
        }
        self.stack.push(Node::Memo(id));
        Ok(())
    }

    fn int_line(&self, s: &str) -> Result<Value> {
        let s = s.trim().trim_end_matches('L');
        match s {
            "00" => return Ok(Value::Bool(false)),
            "01" => return Ok(Value::Bool(true)),
            _ => {}
        }
        if let Ok(v) = s.parse::<i64>() {
            return Ok(Value::I64(v));
        }
        match s.parse::<BigInt>() {
            Ok(v) => Ok(Value::Int(v)),
            Err(_) => self.fail(format_args!("{s:?} is not an integer")),
        }
    }

    /// The text behind a node (through a memo reference), if it is text.
    fn text<'n>(&'n self, node: &'n Node) -> Option<&'n str> {
        match self.deref(node) {
            Node::Scalar(v) => v.as_str(),
            _ => None,
        }
    }

    /// `REDUCE`: a call of `global` on `args`.
    fn call(&mut self, global: Node, args: Node) -> Result<()> {
        let result = self.call_result(&global, &args)?;
        self.stack.push(result);
        Ok(())
    }

    /// What [`Decoder::call`] pushes.
    fn call_result(&self, global: &Node, args: &Node) -> Result<Node> {
        let Node::Tuple(args) = self.deref(args) else {
            return self.fail("a call whose arguments are not a tuple");
        };
        let name = match self.deref(global) {
            Node::Global(m, n) => Some((m.as_str(), n.as_str())),
            _ => None,
        };
        Ok(match name {
            Some(("collections", "OrderedDict")) => match args.as_slice() {
                [] => Node::Dict(Vec::new()),
                [items] => {
                    let Node::List(items) = self.deref(items) else {
                        return self.fail("an OrderedDict made from something other than a list");
                    };
                    let mut pairs = Vec::with_capacity(items.len());
                    for item in items {
                        match self.deref(item) {
                            Node::Tuple(kv) | Node::List(kv) if kv.len() == 2 => {
                                pairs.push((kv[0].clone(), kv[1].clone()))
                            }
                            _ => return self.fail("an OrderedDict whose items are not pairs"),
                        }
                    }
                    Node::Dict(pairs)
                }
                _ => return self.fail("an OrderedDict made from more than one argument"),
            },
            Some(("_codecs", "encode")) => match args.as_slice() {
                [text, enc] if self.text(enc) == Some("latin1") => match self.text(text) {
                    Some(s) => {
                        Node::Scalar(Value::Bytes(s.chars().map(|c| c as u32 as u8).collect()))
                    }
                    None => return self.fail("_codecs.encode of something other than text"),
                },
                _ => Node::Scalar(Value::None),
            },
            // Any other call: what serde-pickle gives for a global it does
            // not know.
            _ => Node::Scalar(Value::None),
        })
    }

    /// Runs the machine to `STOP`: the result and the memo it refers to.
    fn run(mut self) -> Result<(Node, HashMap<u32, Node>)> {
        loop {
            self.op_at = self.pos;
            let op = self.take(1)?[0];
            match op {
                b'\x80' => drop(self.take(1)?), // PROTO
                b'\x95' => drop(self.take(8)?), // FRAME
                b'.' => {
                    let top = self.pop()?; // STOP
                    return Ok((top, self.memo));
                }
                b'(' => {
                    let above = std::mem::take(&mut self.stack); // MARK
                    self.marks.push(above);
                }
                b'0' => {
                    // POP: an empty stack pops its mark, as serde-pickle does.
                    if self.stack.is_empty() {
                        self.pop_mark()?;
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => drop(self.pop_mark()?), // POP_MARK
                b'2' => {
                    // DUP: the same object again.
                    let Some(top) = self.stack.last().cloned() else {
                        return self.fail("the pickle's stack runs empty");
                    };
                    self.stack.push(top);
                }
                b'p' => {
                    let id = self.memo_id_line()?; // PUT
                    self.memoize(id)?;
                }
                b'q' => {
                    let id = self.le(1)? as u32; // BINPUT
                    self.memoize(id)?;
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
                    let id = self.le(1)? as u32; // BINGET
                    self.get(id)?;
                }
                b'j' => {
                    let id = self.le(4)? as u32; // LONG_BINGET
                    self.get(id)?;
                }
                b'N' => self.push(Value::None),
                b'\x88' => self.push(Value::Bool(true)),
                b'\x89' => self.push(Value::Bool(false)),
                b'I' | b'L' => {
                    let line = self.line()?; // INT, LONG
                    let v = self.int_line(&line)?;
                    self.push(v);
                }
                b'F' => {
                    let line = self.line()?; // FLOAT
                    match line.trim().parse::<f64>() {
                        Ok(f) => self.push(Value::F64(f)),
                        Err(_) => return self.fail(format_args!("{line:?} is not a float")),
                    }
                }
                b'S' => {
                    let line = self.line()?; // STRING: a quoted Python 2 string
                    let v = unquote(&line).ok_or_else(|| {
                        anyhow!("byte {}: a string that is not quoted", self.op_at)
                    })?;
                    self.push(Value::Bytes(v.into()));
                }
                b'V' => {
                    let line = self.line()?; // UNICODE: raw-unicode-escape
                    self.push(Value::String(raw_unicode_unescape(&line).into()));
                }
                b'K' => {
                    let v = self.le(1)?; // BININT1
                    self.push(Value::I64(v as i64));
                }
                b'M' => {
                    let v = self.le(2)?; // BININT2
                    self.push(Value::I64(v as i64));
                }
                b'J' => {
                    let v = self.le(4)? as u32 as i32; // BININT
                    self.push(Value::I64(v.into()));
                }
                b'G' => {
                    let b = self.take(8)?; // BINFLOAT, big-endian
                    let f = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                    self.push(Value::F64(f));
                }
                b'\x8a' | b'\x8b' => {
                    // LONG1, LONG4: two's complement, little-endian
                    let n = if op == b'\x8a' {
                        self.len(1)?
                    } else {
                        let n = self.le(4)? as u32 as i32;
                        usize::try_from(n).or_else(|_| self.fail("a negative length"))?
                    };
                    let big = BigInt::from_signed_bytes_le(self.take(n)?);
                    self.push(i64::try_from(&big).map_or(Value::Int(big), Value::I64));
                }
                // SHORT_BINBYTES, SHORT_BINSTRING; BINBYTES, BINSTRING;
                // BINBYTES8, BYTEARRAY8
                b'C' | b'U' | b'B' | b'T' | b'\x8e' | b'\x96' => {
                    let n = match op {
                        b'C' | b'U' => self.len(1)?,
                        b'B' | b'T' => self.len(4)?,
                        _ => self.len(8)?,
                    };
                    let b: Rc<[u8]> = self.take(n)?.into();
                    self.push(Value::Bytes(b));
                }
                // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                b'\x8c' | b'X' | b'\x8d' => {
                    let n = match op {
                        b'\x8c' => self.len(1)?,
                        b'X' => self.len(4)?,
                        _ => self.len(8)?,
                    };
                    let s: Rc<str> = String::from_utf8_lossy(self.take(n)?).into();
                    self.push(Value::String(s));
                }
                b')' => self.stack.push(Node::Tuple(Vec::new())),
                b']' => self.stack.push(Node::List(Vec::new())),
                b'}' => self.stack.push(Node::Dict(Vec::new())),
                b'\x85' | b'\x86' | b'\x87' => {
                    // TUPLE1, TUPLE2, TUPLE3
                    let items = self.pop_n(usize::from(op - b'\x84'))?;
                    self.stack.push(Node::Tuple(items));
                }
                b't' => {
                    let items = self.pop_mark()?; // TUPLE
                    self.stack.push(Node::Tuple(items));
                }
                b'l' => {
                    let items = self.pop_mark()?; // LIST
                    self.stack.push(Node::List(items));
                }
                b'd' => {
                    let items = self.pop_mark()?; // DICT
                    let pairs = pairs(self.op_at, items)?;
                    self.stack.push(Node::Dict(pairs));
                }
                b'a' => {
                    let item = self.pop()?; // APPEND
                    self.extend_top(vec![item])?;
                }
                b's' => {
                    let items = self.pop_n(2)?; // SETITEM
                    self.extend_top(items)?;
                }
                b'e' | b'u' => {
                    let items = self.pop_mark()?; // APPENDS, SETITEMS
                    self.extend_top(items)?;
                }
                b'c' => {
                    let module = self.line()?; // GLOBAL
                    let name = self.line()?;
                    self.stack.push(Node::Global(module, name));
                }
                b'\x93' => {
                    // STACK_GLOBAL: module and name as strings
                    let names = self.pop_n(2)?;
                    match (self.text(&names[0]), self.text(&names[1])) {
                        (Some(m), Some(n)) => {
                            let global = Node::Global(m.to_string(), n.to_string());
                            self.stack.push(global);
                        }
                        _ => return self.fail("a global named by something other than strings"),
                    }
                }
                b'R' => {
                    let args = self.pop()?; // REDUCE
                    let global = self.pop()?;
                    self.call(global, args)?;
                }
                b'b' => {
                    // BUILD: the state replaces the object (in the memo too,
                    // where the object was memoized).
                    let state = self.pop()?;
                    match self.pop()? {
                        Node::Memo(id) => {
                            self.memo.insert(id, state);
                            self.stack.push(Node::Memo(id));
                        }
                        _ => self.stack.push(state),
                    }
                }
                b'\x81' => {
                    self.pop_n(2)?; // NEWOBJ: an empty dict stands in
                    self.stack.push(Node::Dict(Vec::new()));
                }
                b'\x92' => {
                    self.pop_n(3)?; // NEWOBJ_EX
                    self.stack.push(Node::Dict(Vec::new()));
                }
                b'o' => {
                    self.pop_mark()?; // OBJ
                    self.stack.push(Node::Dict(Vec::new()));
                }
                b'i' => {
                    self.line()?; // INST
                    self.line()?;
                    self.pop_mark()?;
                    self.stack.push(Node::Dict(Vec::new()));
                }
                other => {
                    return self.fail(format_args!(
                        "opcode {other:#04x} is not one a snapshot is read with"
                    ))
                }
            }
        }
    }
}

/// A dict's items, taken in pairs (`at`: the opcode's byte, for the error).
fn pairs(at: usize, items: Vec<Node>) -> Result<Vec<(Node, Node)>> {
    if !items.len().is_multiple_of(2) {
        bail!("byte {at}: a dict's items are not in pairs");
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

/// A protocol 0 string argument (`'text'` or `"text"` with Python's
/// escapes) as bytes; `None` when it is not quoted.
fn unquote(line: &str) -> Option<Vec<u8>> {
    let b = line.as_bytes();
    let q = *b.first()?;
    if b.len() < 2 || !(q == b'\'' || q == b'"') || b[b.len() - 1] != q {
        return None;
    }
    let inner = &b[1..b.len() - 1];
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        if inner[i] != b'\\' || i + 1 == inner.len() {
            out.push(inner[i]);
            i += 1;
            continue;
        }
        let e = inner[i + 1];
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0' => out.push(0),
            b'x' if i + 2 <= inner.len() => {
                match std::str::from_utf8(&inner[i..i + 2])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => out.push(v),
                    None => out.extend_from_slice(b"\\x"),
                }
                i += 2;
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// Python's raw-unicode-escape: `\uXXXX` and `\UXXXXXXXX` are characters,
/// everything else stands for itself.
fn raw_unicode_unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let width = match tail.as_bytes().get(1) {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => 0,
        };
        let ch = tail
            .get(2..2 + width)
            .filter(|_| width > 0)
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .and_then(char::from_u32);
        match ch {
            Some(c) => {
                out.push(c);
                rest = &tail[2 + width..];
            }
            None => {
                out.push('\\');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}
