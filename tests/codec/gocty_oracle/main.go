// Command gocty_oracle holds kl's codec to go-cty, the library inside Terraform and every Go
// provider (tests/codec/test_gocty_oracle.py drives it).
//
//	gocty_oracle gen -seed S -n N   JSON lines: fixed edge cases, then N random cases, each a type
//	                                with a msgpack value (as a provider may send it) and a JSON
//	                                value (as state may hold it)
//	gocty_oracle check [-wire-by-value]  reads those lines with kl's results added ("dec"/"enc", each
//	                                {"ok": ...} or {"err": ...}), answers each with go-cty, and
//	                                prints one JSON line per disagreement, then a summary line
//
// A decoded value agrees when go-cty's JSON and kl's, each read back by go-cty's JSON decoder (as
// Terraform reads state) and written again, are the same bytes. An encoded value agrees when the
// msgpack bytes are equal, or, where go-cty's own order is its set hashing, when both decode to
// the same value. An error agrees with an error (go-cty's panics count as errors).
package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"
)

// Case is one line of gen's output and of check's input.
type Case struct {
	Name string          `json:"name"`
	Type json.RawMessage `json:"type"`
	MP   string          `json:"mp,omitempty"`   // hex; decode direction
	JSON string          `json:"json,omitempty"` // encode direction
	Dec  *Result         `json:"dec,omitempty"`
	Enc  *Result         `json:"enc,omitempty"`
}

// Result is kl's (or go-cty's) outcome: Ok is JSON text (decode) or msgpack hex (encode).
type Result struct {
	Ok  *string `json:"ok,omitempty"`
	Err *string `json:"err,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gocty_oracle gen -seed S -n N | gocty_oracle check")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "gen":
		fs := flag.NewFlagSet("gen", flag.ExitOnError)
		seed := fs.Int64("seed", 1, "random seed")
		n := fs.Int("n", 1000, "random cases")
		_ = fs.Parse(os.Args[2:])
		generate(*seed, *n)
	case "check":
		fs := flag.NewFlagSet("check", flag.ExitOnError)
		byValue := fs.Bool("wire-by-value", false, "compare encoded msgpack by the value go-cty decodes, not by bytes")
		_ = fs.Parse(os.Args[2:])
		os.Exit(check(*byValue))
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// guarded runs f, turning a go-cty panic (cty.ListVal on mixed element types) into an error.
func guarded[T any](f func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

func goDecode(ty cty.Type, mp []byte) ([]byte, error) {
	return guarded(func() ([]byte, error) {
		v, err := ctymsgpack.Unmarshal(mp, ty)
		if err != nil {
			return nil, err
		}
		return ctyjson.Marshal(v, ty)
	})
}

func goEncode(ty cty.Type, js []byte) ([]byte, error) {
	return guarded(func() ([]byte, error) {
		v, err := ctyjson.Unmarshal(js, ty)
		if err != nil {
			return nil, err
		}
		return ctymsgpack.Marshal(v, ty)
	})
}

// stateForm is JSON as Terraform holds it after reading it back: go-cty's decoder, then its encoder.
func stateForm(ty cty.Type, js []byte) ([]byte, error) {
	return guarded(func() ([]byte, error) {
		v, err := ctyjson.Unmarshal(js, ty)
		if err != nil {
			return nil, err
		}
		return ctyjson.Marshal(v, ty)
	})
}

// equalValues: both msgpack values decode, to values cty calls equal.
func equalValues(ty cty.Type, a, b []byte) bool {
	eq, err := guarded(func() (bool, error) {
		va, err := ctymsgpack.Unmarshal(a, ty)
		if err != nil {
			return false, err
		}
		vb, err := ctymsgpack.Unmarshal(b, ty)
		if err != nil {
			return false, err
		}
		return va.Equals(vb).True(), nil
	})
	return err == nil && eq
}

func hasSet(ty cty.Type) bool {
	switch {
	case ty.IsSetType():
		return true
	case ty.IsListType() || ty.IsMapType():
		return hasSet(ty.ElementType())
	case ty.IsObjectType():
		for _, a := range ty.AttributeTypes() {
			if hasSet(a) {
				return true
			}
		}
	case ty.IsTupleType():
		for _, e := range ty.TupleElementTypes() {
			if hasSet(e) {
				return true
			}
		}
	case ty == cty.DynamicPseudoType:
		return true // the concrete type inside may have one
	}
	return false
}

type disagreement struct {
	Name   string `json:"name"`
	Dir    string `json:"dir"`
	Type   string `json:"type"`
	Input  string `json:"input"`
	GoCty  string `json:"gocty"`
	Kl     string `json:"kl"`
	Detail string `json:"detail,omitempty"`
}

func describe(ok []byte, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return string(ok)
}

func klDescribe(r *Result) string {
	if r.Err != nil {
		return "error: " + *r.Err
	}
	return *r.Ok
}

func check(wireByValue bool) int {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<28)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	counts := map[string]int{}
	for in.Scan() {
		var c Case
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			fmt.Fprintln(os.Stderr, "bad input line:", err)
			return 2
		}
		ty, err := ctyjson.UnmarshalType(c.Type)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: bad type %s: %v\n", c.Name, c.Type, err)
			return 2
		}
		if c.Dec != nil {
			mp, _ := hex.DecodeString(c.MP)
			goOut, goErr := goDecode(ty, mp)
			d := disagreement{Name: c.Name, Dir: "decode", Type: string(c.Type), Input: c.MP, GoCty: describe(goOut, goErr), Kl: klDescribe(c.Dec)}
			switch {
			case goErr != nil && c.Dec.Err != nil:
				counts["decode both error"]++
			case goErr != nil || c.Dec.Err != nil:
				counts["decode disagree"]++
				_ = enc.Encode(d)
			default:
				want, err1 := stateForm(ty, goOut)
				got, err2 := stateForm(ty, []byte(*c.Dec.Ok))
				// Reading state back normalizes strings, so they are compared as written too.
				goStrs, klStrs := jsonStrings(goOut), jsonStrings([]byte(*c.Dec.Ok))
				if err1 != nil || err2 != nil || !bytes.Equal(want, got) || goStrs != klStrs {
					d.Detail = fmt.Sprintf("as state: gocty %s / kl %s; strings: gocty %s / kl %s",
						describe(want, err1), describe(got, err2), goStrs, klStrs)
					counts["decode disagree"]++
					_ = enc.Encode(d)
				} else {
					counts["decode agree"]++
				}
			}
		}
		if c.Enc != nil {
			goOut, goErr := goEncode(ty, []byte(c.JSON))
			d := disagreement{Name: c.Name, Dir: "encode", Type: string(c.Type), Input: c.JSON, Kl: klDescribe(c.Enc)}
			if goErr != nil {
				d.GoCty = "error: " + goErr.Error()
			} else {
				d.GoCty = hex.EncodeToString(goOut)
			}
			switch {
			case goErr != nil && c.Enc.Err != nil:
				counts["encode both error"]++
			case goErr != nil || c.Enc.Err != nil:
				counts["encode disagree"]++
				_ = enc.Encode(d)
			default:
				klBytes, _ := hex.DecodeString(*c.Enc.Ok)
				if bytes.Equal(klBytes, goOut) {
					counts["encode agree"]++
					break
				}
				// Elements of a set go out in the given order from kl, in hash order from go-cty.
				same := false
				if wireByValue {
					// Equal numbers (cty compares them exactly), whichever wire form each side chose.
					same = equalValues(ty, goOut, klBytes) && mpStrings(goOut, true) == mpStrings(klBytes, true)
				} else if hasSet(ty) {
					a, err1 := goDecode(ty, goOut)
					b, err2 := goDecode(ty, klBytes)
					same = err1 == nil && err2 == nil && bytes.Equal(a, b) && mpStrings(goOut, false) == mpStrings(klBytes, false)
				}
				if same {
					counts["encode agree"]++
				} else {
					counts["encode disagree"]++
					_ = enc.Encode(d)
				}
			}
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "reading input:", err)
		return 2
	}
	keys := []string{"decode agree", "decode both error", "decode disagree", "encode agree", "encode both error", "encode disagree"}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%q:%d", strings.ReplaceAll(k, " ", "_"), counts[k]))
	}
	fmt.Fprintf(out, "{\"summary\":{%s}}\n", strings.Join(parts, ","))
	return 0
}

func collect(v interface{}, out *[]string) {
	switch x := v.(type) {
	case string:
		*out = append(*out, x)
	case []interface{}:
		for _, e := range x {
			collect(e, out)
		}
	case map[string]interface{}:
		for k, e := range x {
			*out = append(*out, k)
			collect(e, out)
		}
	case map[interface{}]interface{}:
		for k, e := range x {
			collect(k, out)
			collect(e, out)
		}
	}
}

func sortedQuoted(strs []string) string {
	if len(strs) == 0 {
		return "[]"
	}
	sort.Strings(strs)
	b, _ := json.Marshal(strs)
	return string(b)
}

// jsonStrings lists every string and key in a JSON text, sorted, exactly as written.
func jsonStrings(js []byte) string {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v interface{}
	if err := dec.Decode(&v); err != nil {
		return "unreadable: " + err.Error()
	}
	var strs []string
	collect(v, &strs)
	return sortedQuoted(strs)
}

// mpStrings lists every string and key in a msgpack value, sorted, exactly as sent (without
// those that read as a number, if skipNumbers: a number may go as text on one side only).
func mpStrings(mp []byte, skipNumbers bool) string {
	var v interface{}
	if err := msgpack.Unmarshal(mp, &v); err != nil {
		return "unreadable: " + err.Error()
	}
	var strs []string
	collect(v, &strs)
	if skipNumbers {
		kept := strs[:0]
		for _, s := range strs {
			if _, err := cty.ParseNumberVal(s); err != nil {
				kept = append(kept, s)
			}
		}
		strs = kept
	}
	return sortedQuoted(strs)
}
