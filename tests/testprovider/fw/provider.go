// Package fw is the test provider built on terraform-plugin-framework (protocol 6): one resource,
// testfw_thing, whose schema holds every shape the framework can express.
package fw

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/list"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"kilolock.test/testprovider/remote"
)

// Address is the source address Terraform and kl know this build by.
const Address = "registry.terraform.io/kilolock/testfw"

type testProvider struct{}

var _ provider.ProviderWithListResources = (*testProvider)(nil)

type providerConfig struct {
	Dir         types.String `tfsdk:"dir"`
	ReadDelayMs types.Int64  `tfsdk:"read_delay_ms"`
}

// New is what providerserver.Serve calls for each provider instance.
func New() provider.Provider { return &testProvider{} }

func (p *testProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "testfw"
}

func (p *testProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Attributes: map[string]schema.Attribute{
			"dir":           schema.StringAttribute{Optional: true, Description: "Directory of the remote objects (default: $" + remote.EnvDir + ")."},
			"read_delay_ms": schema.Int64Attribute{Optional: true, Description: "Milliseconds each read sleeps (default: $" + remote.EnvReadDelay + ", else 0)."},
		},
	}
}

func (p *testProvider) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg providerConfig
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var delay *int64
	if !cfg.ReadDelayMs.IsNull() && !cfg.ReadDelayMs.IsUnknown() {
		v := cfg.ReadDelayMs.ValueInt64()
		delay = &v
	}
	store, err := remote.New(cfg.Dir.ValueString(), delay)
	if err != nil {
		resp.Diagnostics.AddError("testfw: provider configuration", err.Error())
		return
	}
	resp.ResourceData = store
	resp.ListResourceData = store
}

func (p *testProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{newThing}
}

// ListResources: testfw_thing is also a list resource (protocol 6.10, Terraform >= 1.14).
func (p *testProvider) ListResources(context.Context) []func() list.ListResource {
	return []func() list.ListResource{newThingList}
}

func (p *testProvider) DataSources(context.Context) []func() datasource.DataSource { return nil }
