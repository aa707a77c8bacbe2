package fw

import (
	"context"
	"strings"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/list"
	listschema "github.com/hashicorp/terraform-plugin-framework/list/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"kilolock.test/testprovider/remote"
)

// thingList lists the remote objects of testfw_thing: every file in the store's directory, created
// by Terraform or not, each with the identity a read of it returns. Its list configuration narrows
// the listing to ids with a prefix.
type thingList struct{ store *remote.Store }

type thingListConfig struct {
	Prefix types.String `tfsdk:"prefix"`
}

var _ list.ListResourceWithConfigure = (*thingList)(nil)

func newThingList() list.ListResource { return &thingList{} }

func (l *thingList) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_thing"
}

func (l *thingList) ListResourceConfigSchema(_ context.Context, _ list.ListResourceSchemaRequest, resp *list.ListResourceSchemaResponse) {
	resp.Schema = listschema.Schema{
		Attributes: map[string]listschema.Attribute{
			"prefix": listschema.StringAttribute{Optional: true, Description: "Only the objects whose id starts with this."},
		},
	}
}

func (l *thingList) Configure(_ context.Context, req resource.ConfigureRequest, _ *resource.ConfigureResponse) {
	if store, ok := req.ProviderData.(*remote.Store); ok {
		l.store = store
	}
}

func (l *thingList) List(ctx context.Context, req list.ListRequest, stream *list.ListResultsStream) {
	var cfg thingListConfig
	if diags := req.Config.Get(ctx, &cfg); diags.HasError() {
		stream.Results = list.ListResultsStreamDiagnostics(diags)
		return
	}
	ids, err := l.store.List()
	if err != nil {
		var result list.ListResult
		result.Diagnostics.AddError("testfw: listing the remote objects", err.Error())
		stream.Results = list.ListResultsStreamDiagnostics(result.Diagnostics)
		return
	}
	prefix := cfg.Prefix.ValueString()
	stream.Results = func(push func(list.ListResult) bool) {
		// Tests wait for this file to interrupt a listing in flight.
		if err := l.store.MarkListing(); err != nil {
			var result list.ListResult
			result.Diagnostics.AddError("testfw: marking the listing", err.Error())
			push(result)
			return
		}
		sent := int64(0)
		for _, id := range ids {
			if !strings.HasPrefix(id, prefix) {
				continue
			}
			if req.Limit > 0 && sent >= req.Limit {
				return
			}
			time.Sleep(l.store.ReadDelay) // each object costs a read's time, so a listing can be slow on purpose
			result := req.NewListResult(ctx)
			result.DisplayName = "thing " + id
			result.Diagnostics.Append(result.Identity.Set(ctx, identityModel{ID: types.StringValue(id), Region: types.StringValue(region)})...)
			if !push(result) {
				return
			}
			sent++
		}
	}
}
