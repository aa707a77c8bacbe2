package fw

import (
	"encoding/json"
	"fmt"
	"math/big"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// The resource is handled as one generic value: the remote JSON file holds the object exactly as
// Terraform's JSON state would (a dynamic attribute as {"value": ..., "type": ...}), so whatever
// the schema grows, Create writes it and Read reads it back without per-attribute code.

// toJSON turns a known value into plain JSON data; typ is the schema's type at this point, which
// differs from the value's own type only where the schema says dynamic.
func toJSON(v tftypes.Value, typ tftypes.Type) (any, error) {
	if !v.IsKnown() {
		return nil, fmt.Errorf("value of type %s is unknown", v.Type())
	}
	if typ.Is(tftypes.DynamicPseudoType) {
		if v.IsNull() {
			return nil, nil
		}
		inner, err := toJSON(v, v.Type())
		if err != nil {
			return nil, err
		}
		typeJSON, err := v.Type().MarshalJSON()
		if err != nil {
			return nil, err
		}
		return map[string]any{"value": inner, "type": json.RawMessage(typeJSON)}, nil
	}
	if v.IsNull() {
		return nil, nil
	}
	switch t := typ.(type) {
	case tftypes.List, tftypes.Set, tftypes.Tuple:
		var elems []tftypes.Value
		if err := v.As(&elems); err != nil {
			return nil, err
		}
		out := make([]any, len(elems))
		for i, e := range elems {
			var et tftypes.Type
			switch tt := t.(type) {
			case tftypes.List:
				et = tt.ElementType
			case tftypes.Set:
				et = tt.ElementType
			case tftypes.Tuple:
				et = tt.ElementTypes[i]
			}
			j, err := toJSON(e, et)
			if err != nil {
				return nil, err
			}
			out[i] = j
		}
		return out, nil
	case tftypes.Map, tftypes.Object:
		var fields map[string]tftypes.Value
		if err := v.As(&fields); err != nil {
			return nil, err
		}
		out := make(map[string]any, len(fields))
		for k, e := range fields {
			var et tftypes.Type
			if m, ok := t.(tftypes.Map); ok {
				et = m.ElementType
			} else {
				et = t.(tftypes.Object).AttributeTypes[k]
			}
			j, err := toJSON(e, et)
			if err != nil {
				return nil, err
			}
			out[k] = j
		}
		return out, nil
	}
	switch {
	case typ.Is(tftypes.String):
		var s string
		err := v.As(&s)
		return s, err
	case typ.Is(tftypes.Bool):
		var b bool
		err := v.As(&b)
		return b, err
	case typ.Is(tftypes.Number):
		n := new(big.Float)
		if err := v.As(&n); err != nil {
			return nil, err
		}
		return json.Number(n.Text('g', -1)), nil
	}
	return nil, fmt.Errorf("unsupported type %s", typ)
}

// fromJSON reads the remote object back as a value of the schema's type. Attributes the file
// leaves out are null, and ones the schema does not know are ignored, so a hand-edited file only
// needs the parts it changes.
func fromJSON(obj map[string]any, typ tftypes.Object) (tftypes.Value, error) {
	full := make(map[string]any, len(typ.AttributeTypes))
	for name := range typ.AttributeTypes {
		full[name] = obj[name]
	}
	data, err := json.Marshal(full)
	if err != nil {
		return tftypes.Value{}, err
	}
	raw := tfprotov6.RawState{JSON: data}
	return raw.UnmarshalWithOpts(typ, tfprotov6.UnmarshalOpts{ValueFromJSONOpts: tftypes.ValueFromJSONOpts{IgnoreUndefinedAttributes: true}})
}
