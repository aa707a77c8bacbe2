module kilolock.test/gocty_oracle

go 1.25

require (
	github.com/vmihailenco/msgpack/v5 v5.4.1
	github.com/zclconf/go-cty v1.20.0
)

require (
	github.com/apparentlymart/go-textseg/v15 v15.0.0 // indirect
	github.com/apparentlymart/go-textseg/v17 v17.0.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	golang.org/x/text v0.23.0 // indirect
)
