package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// Pieces strings are made of: ASCII, text that is NFC already, text that is not (combining marks
// to compose or reorder, Hangul jamo, singletons), characters Go's JSON escapes, and bytes that
// are not UTF-8 (only on the wire: state JSON is UTF-8 by definition).
var textPieces = []string{
	"a", "id", "Hello", " ", "0", "<b>&", "\u2028", "\t\"\\", "\x01", "\x7f",
	"\u00e9", "\u00c5", "\uac00", "\u65e5\u672c", "\U0001F600", "\ufffd",
	"e\u0301", "A\u030a", "\u1100\u1161", "\u1100\u1161\u11a8", "\u212b", "\u2126", "a\u0301\u0323",
	"\u0323\u0301", "\u0301", "o\u0308\u0304", "\u0958", "\uf900", "\u0344", "\u1e9b\u0323",
}

var invalidPieces = []string{"\xff", "\xe2\x82", "\xed\xa0\x80", "\xc0\x80", "\xf0\x9f", "\xf4\x90\x80\x80", "\x80", "e\xcc"}

// Map keys: distinct once NFC and once invalid bytes are replaced (go-cty keeps one of two keys
// that collapse, at random, and kl refuses them: not compared here).
var mapKeys = []string{"a", "b", "B", "", "k<>&", "\u00e9", "e\u0301x", "\u65e5\u672c", "\u212bngstr\u00f6m", "z z"}

const invalidMapKey = "\xffk"

var attrNames = []string{"a", "b", "id", "name", "tags", "x_y", "Z", "\u00e9t\u00e9", "type", "value"}

type gen struct {
	r *rand.Rand
	// inSet > 0 while drawing a set's elements: no invalid UTF-8, no -0 and no number past 512
	// bits there, because which elements are equal differs (listed differences): kl writes two
	// byte strings that are both U+FFFD once replaced, or -0 and 0, once, where go-cty keeps both,
	// and keeps two numbers that go-cty's 512 bits make one.
	inSet int
}

func (g *gen) chance(p float64) bool { return g.r.Float64() < p }

// typ draws a type; dynamic only when allowDynamic.
func (g *gen) typ(depth int, allowDynamic bool) cty.Type {
	k := g.r.Intn(100)
	if depth >= 3 {
		k = g.r.Intn(55)
	}
	switch {
	case k < 18:
		return cty.String
	case k < 36:
		return cty.Number
	case k < 45:
		return cty.Bool
	case k < 55:
		if allowDynamic {
			return cty.DynamicPseudoType
		}
		return cty.String
	case k < 66:
		return cty.List(g.typ(depth+1, allowDynamic))
	case k < 76:
		return cty.Set(g.typ(depth+1, allowDynamic))
	case k < 86:
		return cty.Map(g.typ(depth+1, allowDynamic))
	case k < 95:
		attrs := map[string]cty.Type{}
		for i := g.r.Intn(4); i > 0; i-- {
			attrs[attrNames[g.r.Intn(len(attrNames))]] = g.typ(depth+1, allowDynamic)
		}
		return cty.Object(attrs)
	default:
		elems := make([]cty.Type, g.r.Intn(3))
		for i := range elems {
			elems[i] = g.typ(depth+1, allowDynamic)
		}
		return cty.Tuple(elems)
	}
}

// instance replaces each dynamic in ty by a concrete type, so a collection's elements can share
// one (otherwise each dynamic value draws its own, and most such collections are refused).
func (g *gen) instance(ty cty.Type, depth int) cty.Type {
	switch {
	case ty == cty.DynamicPseudoType:
		return g.typ(depth+1, false)
	case ty.IsListType():
		return cty.List(g.instance(ty.ElementType(), depth+1))
	case ty.IsSetType():
		return cty.Set(g.instance(ty.ElementType(), depth+1))
	case ty.IsMapType():
		return cty.Map(g.instance(ty.ElementType(), depth+1))
	case ty.IsObjectType():
		attrs := map[string]cty.Type{}
		for _, n := range sortedNames(ty) {
			attrs[n] = g.instance(ty.AttributeType(n), depth+1)
		}
		return cty.Object(attrs)
	case ty.IsTupleType():
		elems := make([]cty.Type, len(ty.TupleElementTypes()))
		for i, e := range ty.TupleElementTypes() {
			elems[i] = g.instance(e, depth+1)
		}
		return cty.Tuple(elems)
	}
	return ty
}

func typeJSON(ty cty.Type) []byte {
	b, err := ctyjson.MarshalType(ty)
	if err != nil {
		panic(err)
	}
	return b
}

func (g *gen) text(wire bool) string {
	var b strings.Builder
	for i := g.r.Intn(4); i > 0; i-- {
		if wire && g.inSet == 0 && g.chance(0.15) {
			b.WriteString(invalidPieces[g.r.Intn(len(invalidPieces))])
		} else {
			b.WriteString(textPieces[g.r.Intn(len(textPieces))])
		}
	}
	return b.String()
}

// --- msgpack, written by hand so any form a provider may send can be drawn ---------------------

type mp struct{ b []byte }

func (m *mp) head(fix byte, fixMax int, m8, m16, m32 byte, n int) {
	switch {
	case n <= fixMax:
		m.b = append(m.b, fix|byte(n))
	case m8 != 0 && n < 1<<8:
		m.b = append(m.b, m8, byte(n))
	case n < 1<<16:
		m.b = append(m.b, m16, byte(n>>8), byte(n))
	default:
		m.b = append(m.b, m32)
		m.b = binary.BigEndian.AppendUint32(m.b, uint32(n))
	}
}

func (m *mp) str(s string)  { m.head(0xa0, 31, 0xd9, 0xda, 0xdb, len(s)); m.b = append(m.b, s...) }
func (m *mp) bin(s []byte)  { m.head(0, -1, 0xc4, 0xc5, 0xc6, len(s)); m.b = append(m.b, s...) }
func (m *mp) array(n int)   { m.head(0x90, 15, 0, 0xdc, 0xdd, n) }
func (m *mp) mapHead(n int) { m.head(0x80, 15, 0, 0xde, 0xdf, n) }

var specialFloats = []float64{
	0.5, 0.1, -0.25, 1e21, 1e22, 1e23, 0x1p64, 0x1p63, 0x1p53, 0x1p-1074, 0x1p-1022, 0x1.fffffffffffffp1023,
	-0x1p64, 5e-324, 2.5e-323, 1.7976931348623157e308, 509906548019138368, 1e17 + 8, 123456789012345680,
	0.1 + 0.2, 1.0 / 3, 3, 1e15, 4503599627370497.5,
}

func (g *gen) float(m *mp) {
	var f float64
	switch g.r.Intn(6) {
	case 0:
		f = specialFloats[g.r.Intn(len(specialFloats))]
	case 1:
		f = math.Ldexp(1, g.r.Intn(2098)-1074) // powers of two, subnormal to huge
	case 2:
		f = math.Float64frombits(g.r.Uint64() >> uint(12+g.r.Intn(52))) // subnormals
	case 3:
		f = float64(g.r.Int63n(1<<62)) * math.Pow(10, float64(g.r.Intn(8))) // large whole numbers
	case 4:
		f32 := math.Float32frombits(g.r.Uint32())
		if math.IsNaN(float64(f32)) || math.IsInf(float64(f32), 0) || (f32 == 0 && g.inSet > 0) {
			f32 = 0.1
		}
		m.b = append(m.b, 0xca)
		m.b = binary.BigEndian.AppendUint32(m.b, math.Float32bits(f32))
		return
	default:
		f = math.Float64frombits(g.r.Uint64())
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		f = 1.5 // kl refuses both (state holds finite numbers): a listed difference, not drawn
	}
	if f == 0 && g.inSet > 0 {
		f = 0.5
	}
	if g.chance(0.5) {
		f = -f
	}
	m.b = append(m.b, 0xcb)
	m.b = binary.BigEndian.AppendUint64(m.b, math.Float64bits(f))
}

func (g *gen) number(m *mp) {
	switch g.r.Intn(5) {
	case 0:
		v := g.r.Int63() >> uint(g.r.Intn(63))
		if g.chance(0.5) {
			v = -v
		}
		forms := []byte{0xd0, 0xd1, 0xd2, 0xd3}
		switch {
		case v >= -32 && v < 128 && g.chance(0.5):
			m.b = append(m.b, byte(v))
		case v >= math.MinInt8 && v <= math.MaxInt8:
			m.b = append(m.b, forms[0], byte(v))
		case v >= math.MinInt16 && v <= math.MaxInt16:
			m.b = append(m.b, forms[1], byte(v>>8), byte(v))
		case v >= math.MinInt32 && v <= math.MaxInt32:
			m.b = append(m.b, forms[2])
			m.b = binary.BigEndian.AppendUint32(m.b, uint32(v))
		default:
			m.b = append(m.b, forms[3])
			m.b = binary.BigEndian.AppendUint64(m.b, uint64(v))
		}
	case 1:
		v := g.r.Uint64() >> uint(g.r.Intn(64))
		m.b = append(m.b, 0xcf)
		m.b = binary.BigEndian.AppendUint64(m.b, v)
	case 2, 3:
		g.float(m)
	default:
		text := g.numberText(true)
		if g.inSet > 0 && (text == "-0" || text == "0.0") {
			text = "7"
		}
		m.str(text)
	}
}

// numberText is decimal text in JSON number syntax (what go-cty writes and kl reads). Text past
// go-cty's 512 bits only on the wire: kl sends every digit where go-cty sends its 512-bit
// rounding (a listed difference, the same number to the provider).
func (g *gen) numberText(wire bool) string {
	digits := func(n int) string {
		var b strings.Builder
		b.WriteByte(byte('1' + g.r.Intn(9)))
		for i := 1; i < n; i++ {
			b.WriteByte(byte('0' + g.r.Intn(10)))
		}
		return b.String()
	}
	sign := ""
	if g.chance(0.3) {
		sign = "-"
	}
	k := g.r.Intn(6)
	if k == 4 && (!wire || g.inSet > 0) { // (in a set, two of them may be one number to go-cty)
		k = 0
	}
	switch k {
	case 0:
		return sign + digits(19+g.r.Intn(30)) // beyond int64
	case 1:
		return sign + digits(1+g.r.Intn(20)) + "." + digits(1+g.r.Intn(20))
	case 2:
		return sign + "0." + strings.Repeat("0", g.r.Intn(30)) + digits(1+g.r.Intn(10))
	case 3:
		return sign + digits(1+g.r.Intn(5)) + "e" + strconv.Itoa(g.r.Intn(60)-30)
	case 4:
		return sign + digits(160+g.r.Intn(60)) // past go-cty's 512 bits
	default:
		return []string{"18446744073709551616", "9223372036854775808", "0.1", "1.5", "100000000000000000000", "-0", "0.0"}[g.r.Intn(7)]
	}
}

// wire writes a msgpack value of ty. inst, when not cty.NilType, is the concrete type to use at
// the dynamic positions of ty (see instance).
func (g *gen) wire(m *mp, ty, inst cty.Type, depth int) {
	if g.chance(0.08) && !(inst != cty.NilType && ty != cty.DynamicPseudoType && hasDynamic(ty)) {
		m.b = append(m.b, 0xc0)
		return
	}
	switch {
	case ty == cty.String:
		m.str(g.text(true))
	case ty == cty.Number:
		g.number(m)
	case ty == cty.Bool:
		m.b = append(m.b, 0xc2|byte(g.r.Intn(2)))
	case ty == cty.DynamicPseudoType:
		c := inst
		if c == cty.NilType {
			c = g.typ(depth+1, depth < 2)
			if c == cty.DynamicPseudoType {
				c = cty.String
			}
		}
		m.array(2)
		if g.chance(0.5) {
			m.bin(typeJSON(c))
		} else {
			m.str(string(typeJSON(c)))
		}
		g.wire(m, c, pinned(c), depth+1)
	case ty.IsListType() || ty.IsSetType():
		n := g.r.Intn(5)
		m.array(n)
		elemInst := g.elementInstance(ty.ElementType(), inst, depth)
		if ty.IsSetType() {
			g.inSet++
			defer func() { g.inSet-- }()
		}
		for i := 0; i < n; i++ {
			g.wire(m, ty.ElementType(), elemInst, depth+1)
		}
	case ty.IsMapType():
		keys := g.keys(true)
		m.mapHead(len(keys))
		elemInst := g.elementInstance(ty.ElementType(), inst, depth)
		for _, k := range keys {
			m.str(k)
			g.wire(m, ty.ElementType(), elemInst, depth+1)
		}
	case ty.IsObjectType():
		names := sortedNames(ty)
		g.r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		m.mapHead(len(names)) // go-cty wants all attributes (kl also takes fewer: a listed difference)
		for _, n := range names {
			m.str(n)
			g.wire(m, ty.AttributeType(n), sub(inst, func(t cty.Type) cty.Type { return t.AttributeType(n) }), depth+1)
		}
	case ty.IsTupleType():
		elems := ty.TupleElementTypes()
		m.array(len(elems))
		for i, e := range elems {
			g.wire(m, e, sub(inst, func(t cty.Type) cty.Type { return t.TupleElementType(i) }), depth+1)
		}
	}
}

// sortedNames: an object's attribute names in a fixed order, so a seed always draws the same cases.
func sortedNames(ty cty.Type) []string {
	names := make([]string, 0, len(ty.AttributeTypes()))
	for n := range ty.AttributeTypes() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func pinned(c cty.Type) cty.Type {
	if hasDynamic(c) {
		return cty.NilType
	}
	return c
}

func sub(inst cty.Type, f func(cty.Type) cty.Type) cty.Type {
	if inst == cty.NilType {
		return cty.NilType
	}
	return f(inst)
}

// elementInstance: most collections whose element type has dynamic in it get one concrete
// element type for all elements; the rest draw freely (and are mostly refused, by both).
func (g *gen) elementInstance(elem, inst cty.Type, depth int) cty.Type {
	if inst != cty.NilType {
		return inst.ElementType()
	}
	if hasDynamic(elem) && g.chance(0.7) {
		return g.instance(elem, depth)
	}
	return cty.NilType
}

func hasDynamic(ty cty.Type) bool {
	switch {
	case ty == cty.DynamicPseudoType:
		return true
	case ty.IsListType() || ty.IsSetType() || ty.IsMapType():
		return hasDynamic(ty.ElementType())
	case ty.IsObjectType():
		for _, a := range ty.AttributeTypes() {
			if hasDynamic(a) {
				return true
			}
		}
	case ty.IsTupleType():
		for _, e := range ty.TupleElementTypes() {
			if hasDynamic(e) {
				return true
			}
		}
	}
	return false
}

func (g *gen) keys(wire bool) []string {
	perm := g.r.Perm(len(mapKeys))[:g.r.Intn(5)]
	keys := make([]string, 0, len(perm)+1)
	for _, i := range perm {
		keys = append(keys, mapKeys[i])
	}
	if wire && g.chance(0.1) {
		keys = append(keys, invalidMapKey)
	}
	return keys
}

// --- JSON, as state may hold it --------------------------------------------------------------

func quoteJSON(s string, escape bool) string {
	b, _ := json.Marshal(s) // escapes <, >, & and U+2028/9 as \u....
	if escape {
		return string(b)
	}
	var out strings.Builder
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(out.String(), "\n")
}

func (g *gen) jsonNumber() string {
	switch g.r.Intn(4) {
	case 0:
		return strconv.FormatInt(g.r.Int63()>>uint(g.r.Intn(63))*int64(1-2*g.r.Intn(2)), 10)
	case 1:
		f := specialFloats[g.r.Intn(len(specialFloats))]
		return strconv.FormatFloat(f, []byte{'f', 'e', 'g'}[g.r.Intn(3)], -1, 64)
	case 2:
		return []string{"1.50", "1E+3", "0.1e1", "-0", "-0.0", "2.5e-1", "1e20", "9223372036854775807", "9223372036854775808"}[g.r.Intn(9)]
	default:
		return g.numberText(false)
	}
}

func (g *gen) json(b *strings.Builder, ty, inst cty.Type, depth int) {
	if g.chance(0.08) && !(inst != cty.NilType && ty != cty.DynamicPseudoType && hasDynamic(ty)) {
		b.WriteString("null")
		return
	}
	switch {
	case ty == cty.String:
		b.WriteString(quoteJSON(g.text(false), g.chance(0.5)))
	case ty == cty.Number:
		b.WriteString(g.jsonNumber())
	case ty == cty.Bool:
		b.WriteString([]string{"false", "true"}[g.r.Intn(2)])
	case ty == cty.DynamicPseudoType:
		c := inst
		if c == cty.NilType {
			c = g.typ(depth+1, depth < 2)
			if c == cty.DynamicPseudoType {
				c = cty.Number
			}
		}
		var v strings.Builder
		g.json(&v, c, pinned(c), depth+1)
		if g.chance(0.5) {
			fmt.Fprintf(b, `{"type":%s,"value":%s}`, typeJSON(c), v.String())
		} else {
			fmt.Fprintf(b, `{"value": %s, "type": %s}`, v.String(), typeJSON(c))
		}
	case ty.IsListType() || ty.IsSetType():
		b.WriteByte('[')
		elemInst := g.elementInstance(ty.ElementType(), inst, depth)
		for i := g.r.Intn(5); i > 0; i-- {
			g.json(b, ty.ElementType(), elemInst, depth+1)
			if i > 1 {
				b.WriteByte(',')
			}
		}
		b.WriteByte(']')
	case ty.IsMapType():
		b.WriteByte('{')
		elemInst := g.elementInstance(ty.ElementType(), inst, depth)
		for i, k := range g.keys(false) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(quoteJSON(k, g.chance(0.5)) + ":")
			g.json(b, ty.ElementType(), elemInst, depth+1)
		}
		b.WriteByte('}')
	case ty.IsObjectType():
		b.WriteByte('{')
		first := true
		for _, n := range sortedNames(ty) {
			a := ty.AttributeType(n)
			if g.chance(0.2) && !(inst != cty.NilType && hasDynamic(a)) {
				continue // absent: null, for go-cty and kl alike
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(quoteJSON(n, false) + ":")
			g.json(b, a, sub(inst, func(t cty.Type) cty.Type { return t.AttributeType(n) }), depth+1)
		}
		b.WriteByte('}')
	case ty.IsTupleType():
		b.WriteByte('[')
		for i, e := range ty.TupleElementTypes() {
			if i > 0 {
				b.WriteByte(',')
			}
			g.json(b, e, sub(inst, func(t cty.Type) cty.Type { return t.TupleElementType(i) }), depth+1)
		}
		b.WriteByte(']')
	}
}

// --- fixed edge cases: the examples and each rule's corners --------------------------

type fixed struct{ name, ty, mp, json string }

var edgeCases = []fixed{
	{"float64 2^64", `"number"`, "cb43f0000000000000", ""},
	{"float64 smallest subnormal", `"number"`, "cb0000000000000001", ""},
	{"float64 largest", `"number"`, "cb7fefffffffffffff", ""},
	{"float64 near 5e17", `"number"`, "cb439c4e35371d4e3d", ""},
	{"float64 -0", `"number"`, "cb8000000000000000", ""},
	{"number string -0", `"number"`, "a22d30", ""},
	{"number string past 512 bits", `"number"`, "d9a0" + hex.EncodeToString([]byte(strings.Repeat("1234567890", 16))), ""},
	{"dynamic tagged map of dynamic", `"dynamic"`, "92b15b226d6170222c2264796e616d6963225d81a16b92ae5b226d6170222c22626f6f6c225d81a161c3", ""},
	{"float32 0.1", `"number"`, "ca3dcccccd", ""},
	{"uint64 max", `"number"`, "cfffffffffffffffff", ""},
	{"invalid utf8 runs", `"string"`, "a8e28241eda080c080", ""},
	{"invalid utf8 then combining mark", `"string"`, "a3ffcc81", ""},
	{"truncated utf8 at the end", `"string"`, "a361f09f", ""},
	{"non-NFC string", `"string"`, "a965cc81e18480e185a1", ""},
	{"non-NFC map key", `["map","bool"]`, "82a365cc81c3a166c2", ""},
	{"list of dynamic mixed", `["list","dynamic"]`, "9292c408226e756d626572220192c40822737472696e6722a161", ""},
	{"list of dynamic null first", `["list","dynamic"]`, "92c092c408226e756d6265722201", ""},
	{"list of list of dynamic empty and not", `["list",["list","dynamic"]]`, "92909192c40822737472696e6722a161", ""},
	{"int beyond int64", `"number"`, "", "18446744073709551616"},
	{"1e20", `"number"`, "", "1e20"},
	{"exact non-integer float", `"number"`, "", "0.5"},
	{"2^53 + 0.5", `"number"`, "", "9007199254740992.5"},
	{"non-NFC JSON string", `"string"`, "", `"e\u0301"`},
	{"non-NFC JSON map key", `["map","number"]`, "", `{"e\u0301":1,"f":2}`},
	{"JSON list of dynamic mixed", `["list","dynamic"]`, "", `[{"type":"number","value":1},{"type":"string","value":"a"}]`},
	{"JSON set of dynamic mixed", `["set","dynamic"]`, "", `[{"type":"bool","value":true},{"type":"number","value":1}]`},
	{"JSON map of dynamic mixed", `["map","dynamic"]`, "", `{"a":{"type":"bool","value":true},"b":{"type":"number","value":1}}`},
	{"JSON list of dynamic one type", `["list","dynamic"]`, "", `[{"type":"number","value":1},null,{"type":"number","value":2}]`},
}

func generate(seed int64, n int) {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, e := range edgeCases {
		_ = enc.Encode(Case{Name: "edge: " + e.name, Type: json.RawMessage(e.ty), MP: e.mp, JSON: e.json})
	}
	g := &gen{r: rand.New(rand.NewSource(seed))}
	for i := 0; i < n; i++ {
		ty := g.typ(0, true)
		var m mp
		g.wire(&m, ty, cty.NilType, 0)
		var b strings.Builder
		g.json(&b, ty, cty.NilType, 0)
		_ = enc.Encode(Case{Name: fmt.Sprintf("seed %d case %d", seed, i), Type: typeJSON(ty), MP: hex.EncodeToString(m.b), JSON: b.String()})
	}
}
