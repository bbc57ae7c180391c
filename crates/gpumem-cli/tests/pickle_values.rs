//! The pickle decoder (`pickle_values`) against what Python's pickler
//! writes: values shared between places (PyTorch's snapshots share their
//! frames that way) stay one value, and any value serde-pickle writes reads
//! back as it was.

use std::rc::Rc;

use gpumem_cli::pickle_values::Value;
use gpumem_cli::snapshot::{as_list, key, read_pickle};
use proptest::prelude::*;

/// `fr = [{'filename': 'a.py', 'line': 1, 'name': 'f'}]` and then
/// `pickle.dumps([fr, fr, {'frames': fr}], protocol=P)`, P = 2 and 4.
const SHARED_P2: &[u8] = b"\x80\x02]q\x00(]q\x01}q\x02(X\x08\x00\x00\x00filenameq\x03X\x04\x00\x00\x00a.pyq\x04X\x04\x00\x00\x00lineq\x05K\x01X\x04\x00\x00\x00nameq\x06X\x01\x00\x00\x00fq\x07uah\x01}q\x08X\x06\x00\x00\x00framesq\th\x01se.";
const SHARED_P4: &[u8] = b"\x80\x04\x95B\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x01\x8c\x04name\x94\x8c\x01f\x94uah\x01}\x94\x8c\x06frames\x94h\x01se.";

fn s(text: &str) -> Value {
    Value::String(text.into())
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

#[test]
fn a_value_held_in_several_places_is_read_once_and_shared() {
    let frame = dict(vec![
        ("filename", s("a.py")),
        ("line", Value::I64(1)),
        ("name", s("f")),
    ]);
    let fr = Value::List(vec![frame].into());
    let want = Value::List(vec![fr.clone(), fr.clone(), dict(vec![("frames", fr)])].into());
    for bytes in [SHARED_P2, SHARED_P4] {
        // serde-pickle loses the second and third uses of `fr`.
        assert!(serde_pickle::value_from_slice(bytes, Default::default()).is_err());
        let got = read_pickle(bytes).unwrap();
        assert_eq!(got, want);
        let items = as_list(&got).unwrap();
        let Value::Dict(last) = &items[2] else {
            panic!("not a dict")
        };
        let lists = [&items[0], &items[1], key(last, "frames").unwrap()];
        let ptrs: Vec<_> = lists.iter().map(|v| as_list(v).unwrap().as_ptr()).collect();
        assert!(ptrs.iter().all(|&p| p == ptrs[0]), "one list, shared");
    }
}

#[test]
fn an_entry_changed_after_it_was_referred_to_is_read_as_python_reads_it() {
    // a = []; b = [a]; then 1 is appended to a; the result is b. Python's
    // pickler never writes this order, its unpickler gives [[1]].
    let bytes = b"\x80\x02]q\x00]q\x01h\x00a0K\x01a0h\x01.";
    let v = read_pickle(bytes).unwrap();
    assert_eq!(
        v,
        Value::List(vec![Value::List(vec![Value::I64(1)].into())].into())
    );
}

#[test]
fn a_key_set_twice_reads_as_its_last_value() {
    // {'a': 1} with SETITEM 'a' = 2 after it, as Python's unpickler keeps it.
    let bytes = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01sX\x01\x00\x00\x00aK\x02s.";
    let Value::Dict(d) = read_pickle(bytes).unwrap() else {
        panic!("not a dict")
    };
    assert_eq!(key(&d, "a"), Some(&Value::I64(2)));
}

/// The decoder's value for what serde-pickle holds.
fn from_serde(v: &serde_pickle::Value) -> Value {
    use serde_pickle::{HashableValue as H, Value as S};
    fn key(k: &H) -> Value {
        match k {
            H::I64(i) => Value::I64(*i),
            H::String(t) => s(t),
            other => panic!("no such key here: {other:?}"),
        }
    }
    match v {
        S::None => Value::None,
        S::Bool(b) => Value::Bool(*b),
        S::I64(i) => Value::I64(*i),
        S::Int(b) => Value::Int(b.clone()),
        S::F64(f) => Value::F64(*f),
        S::Bytes(b) => Value::Bytes(b.as_slice().into()),
        S::String(t) => s(t),
        S::List(l) => Value::List(l.iter().map(from_serde).collect()),
        S::Tuple(l) => Value::Tuple(l.iter().map(from_serde).collect()),
        S::Dict(d) => Value::Dict(d.iter().map(|(k, v)| (key(k), from_serde(v))).collect()),
        other => panic!("not generated: {other:?}"),
    }
}

fn scalar() -> impl Strategy<Value = serde_pickle::Value> {
    use serde_pickle::Value as S;
    prop_oneof![
        Just(S::None),
        any::<bool>().prop_map(S::Bool),
        any::<i64>().prop_map(S::I64),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(S::F64),
        "[a-z_./]{0,12}".prop_map(S::String),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(S::Bytes),
    ]
}

fn hashable_key() -> impl Strategy<Value = serde_pickle::HashableValue> {
    use serde_pickle::HashableValue as H;
    prop_oneof![
        any::<i64>().prop_map(H::I64),
        "[a-z_]{0,8}".prop_map(H::String)
    ]
}

fn value() -> impl Strategy<Value = serde_pickle::Value> {
    use serde_pickle::Value as S;
    scalar().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(S::List),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(S::Tuple),
            proptest::collection::btree_map(hashable_key(), inner, 0..5).prop_map(S::Dict),
        ]
    })
}

proptest! {
    /// What serde-pickle writes (no memo), the decoder reads back as it was.
    #[test]
    fn what_serde_pickle_writes_reads_back(v in value()) {
        for options in [serde_pickle::SerOptions::new(), serde_pickle::SerOptions::new().proto_v2()] {
            let bytes = serde_pickle::value_to_vec(&v, options).unwrap();
            prop_assert_eq!(read_pickle(&bytes).unwrap(), from_serde(&v));
        }
    }
}

#[test]
fn shared_values_are_not_copied() {
    // One list of 1,000 strings referred to 10,000 times: one list in the
    // value, not 10 million strings.
    let mut p = b"\x80\x02](".to_vec();
    for i in 0..1000u32 {
        let t = format!("frame {i}");
        p.push(b'X');
        p.extend((t.len() as u32).to_le_bytes());
        p.extend(t.as_bytes());
    }
    p.extend(b"eq\x00]q\x01(");
    for _ in 0..10_000 {
        p.extend(b"h\x00");
    }
    p.extend(b"e.");
    let v = read_pickle(&p).unwrap();
    let outer = as_list(&v).unwrap();
    assert_eq!(outer.len(), 10_000);
    let Value::List(first) = &outer[0] else {
        panic!("not a list")
    };
    assert_eq!(first.len(), 1000);
    for item in outer {
        let Value::List(l) = item else {
            panic!("not a list")
        };
        assert!(Rc::ptr_eq(l, first));
    }
}

#[test]
fn items_added_through_a_reference_memoized_again_reach_the_object() {
    // l = []; memo 0 is l, memo 1 is l again (a reference memoized again,
    // which Python's pickler never writes); 5 is appended through memo 1,
    // and the result is memo 0: Python's unpickler gives [5].
    let bytes = b"\x80\x02]q\x00h\x00q\x01K\x05a0.";
    assert_eq!(
        read_pickle(bytes).unwrap(),
        Value::List(vec![Value::I64(5)].into())
    );
}
