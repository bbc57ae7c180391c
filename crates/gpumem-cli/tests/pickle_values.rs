//! The pickle decoder (`pickle_values`) against what Python's pickler
//! writes: values shared between places (PyTorch's snapshots share their
//! frames that way), a budget on the copies, and any value serde-pickle
//! writes read back as it was.

use std::collections::BTreeMap;

use gpumem_cli::pickle_values::decode;
use gpumem_cli::snapshot::read_pickle;
use proptest::prelude::*;
use serde_pickle::{HashableValue, Value};

/// `fr = [{'filename': 'a.py', 'line': 1, 'name': 'f'}]` and then
/// `pickle.dumps([fr, fr, {'frames': fr}], protocol=P)`, P = 2 and 4.
const SHARED_P2: &[u8] = b"\x80\x02]q\x00(]q\x01}q\x02(X\x08\x00\x00\x00filenameq\x03X\x04\x00\x00\x00a.pyq\x04X\x04\x00\x00\x00lineq\x05K\x01X\x04\x00\x00\x00nameq\x06X\x01\x00\x00\x00fq\x07uah\x01}q\x08X\x06\x00\x00\x00framesq\th\x01se.";
const SHARED_P4: &[u8] = b"\x80\x04\x95B\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x01\x8c\x04name\x94\x8c\x01f\x94uah\x01}\x94\x8c\x06frames\x94h\x01se.";

fn s(text: &str) -> Value {
    Value::String(text.into())
}

fn key(text: &str) -> HashableValue {
    HashableValue::String(text.into())
}

#[test]
fn a_value_held_in_several_places_is_read_in_each() {
    let frame = Value::Dict(BTreeMap::from([
        (key("filename"), s("a.py")),
        (key("line"), Value::I64(1)),
        (key("name"), s("f")),
    ]));
    let fr = Value::List(vec![frame]);
    let want = Value::List(vec![
        fr.clone(),
        fr.clone(),
        Value::Dict(BTreeMap::from([(key("frames"), fr)])),
    ]);
    for bytes in [SHARED_P2, SHARED_P4] {
        // serde-pickle loses the second and third uses of `fr`.
        assert!(serde_pickle::value_from_slice(bytes, Default::default()).is_err());
        assert_eq!(read_pickle(bytes).unwrap(), want);
    }
}

#[test]
fn copies_of_shared_values_count_against_the_budget() {
    // 27 values: the outer list, `fr` (a list, a dict, 3 keys and 3
    // values: 8) made once and copied twice, the last dict and its key.
    let err = decode(SHARED_P4, 26).unwrap_err().to_string();
    assert!(err.contains("more than 26 values"), "{err}");
    assert!(decode(SHARED_P4, 27).is_ok());
}

#[test]
fn an_entry_changed_after_it_was_referred_to_is_read_as_python_reads_it() {
    // a = []; b = [a]; then 1 is appended to a; the result is b. Python's
    // pickler never writes this order, its unpickler gives [[1]].
    let bytes = b"\x80\x02]q\x00]q\x01h\x00a0K\x01a0h\x01.";
    let v = read_pickle(bytes).unwrap();
    assert_eq!(v, Value::List(vec![Value::List(vec![Value::I64(1)])]));
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::I64),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(Value::F64),
        "[a-z_./]{0,12}".prop_map(Value::String),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Value::Bytes),
    ]
}

fn hashable_key() -> impl Strategy<Value = HashableValue> {
    prop_oneof![
        any::<i64>().prop_map(HashableValue::I64),
        "[a-z_]{0,8}".prop_map(HashableValue::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Tuple),
            proptest::collection::btree_map(hashable_key(), inner, 0..5).prop_map(Value::Dict),
        ]
    })
}

proptest! {
    /// What serde-pickle writes (no memo), the decoder reads back as it was.
    #[test]
    fn what_serde_pickle_writes_reads_back(v in value()) {
        for options in [serde_pickle::SerOptions::new(), serde_pickle::SerOptions::new().proto_v2()] {
            let bytes = serde_pickle::value_to_vec(&v, options).unwrap();
            prop_assert_eq!(read_pickle(&bytes).unwrap(), v.clone());
        }
    }
}
