package fw

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/identityschema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-go/tftypes"

	"kilolock.test/testprovider/remote"
)

// testfw_thing, schema version 1. Version 0 called "name" "title"; the upgrader renames it.
// Identity version 1 is {id, region}; version 0 was {name}, upgraded to {id = name, region = "local"}.
// Private state holds "reads", the number of reads since create, so a refresh changes it.
type thing struct{ store *remote.Store }

type identityModel struct {
	ID     types.String `tfsdk:"id"`
	Region types.String `tfsdk:"region"`
}

const region = "local"

// writeOnly names the attributes never kept: not in the remote file, null in state.
var writeOnly = []string{"password_wo"}

func newThing() resource.Resource { return &thing{} }

var (
	_ resource.ResourceWithConfigure       = (*thing)(nil)
	_ resource.ResourceWithImportState     = (*thing)(nil)
	_ resource.ResourceWithUpgradeState    = (*thing)(nil)
	_ resource.ResourceWithIdentity        = (*thing)(nil)
	_ resource.ResourceWithUpgradeIdentity = (*thing)(nil)
)

func (r *thing) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_thing"
}

func (r *thing) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	pair := map[string]schema.Attribute{
		"a": schema.StringAttribute{Optional: true},
		"n": schema.NumberAttribute{Optional: true},
	}
	resp.Schema = schema.Schema{
		Version: 1,
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Required:      true,
				Description:   "Names the remote object: <dir>/<id>.json.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"name":   schema.StringAttribute{Optional: true},
			"tags":   schema.MapAttribute{Optional: true, ElementType: types.StringType},
			"secret": schema.StringAttribute{Optional: true, Sensitive: true},
			"password_wo": schema.StringAttribute{Optional: true, WriteOnly: true,
				Description: "Write-only: sent in config, never stored (needs Terraform >= 1.11)."},
			"dyn": schema.DynamicAttribute{Optional: true},
			"objects": schema.SetAttribute{Optional: true, ElementType: types.ObjectType{AttrTypes: map[string]attr.Type{
				"k": types.StringType, "v": types.NumberType,
			}}},
			"single": schema.SingleNestedAttribute{Optional: true, Attributes: map[string]schema.Attribute{
				"a":     schema.StringAttribute{Optional: true},
				"n":     schema.NumberAttribute{Optional: true},
				"token": schema.StringAttribute{Optional: true, Sensitive: true},
			}},
			"list_nested": schema.ListNestedAttribute{Optional: true, NestedObject: schema.NestedAttributeObject{Attributes: pair}},
			"set_nested":  schema.SetNestedAttribute{Optional: true, NestedObject: schema.NestedAttributeObject{Attributes: pair}},
			"map_nested":  schema.MapNestedAttribute{Optional: true, NestedObject: schema.NestedAttributeObject{Attributes: pair}},
		},
		Blocks: map[string]schema.Block{
			"rule": schema.ListNestedBlock{NestedObject: schema.NestedBlockObject{Attributes: map[string]schema.Attribute{
				"key":   schema.StringAttribute{Required: true},
				"value": schema.StringAttribute{Optional: true},
			}}},
			"member": schema.SetNestedBlock{NestedObject: schema.NestedBlockObject{Attributes: map[string]schema.Attribute{
				"name": schema.StringAttribute{Required: true},
				"role": schema.StringAttribute{Optional: true},
			}}},
			// A single nested block: drift shows settings.level, as for an object.
			"settings": schema.SingleNestedBlock{Attributes: map[string]schema.Attribute{
				"mode":  schema.StringAttribute{Optional: true},
				"level": schema.NumberAttribute{Optional: true},
			}},
		},
	}
}

func (r *thing) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = identityschema.Schema{
		Version: 1,
		Attributes: map[string]identityschema.Attribute{
			"id":     identityschema.StringAttribute{RequiredForImport: true},
			"region": identityschema.StringAttribute{OptionalForImport: true},
		},
	}
}

func (r *thing) Configure(_ context.Context, req resource.ConfigureRequest, _ *resource.ConfigureResponse) {
	if store, ok := req.ProviderData.(*remote.Store); ok {
		r.store = store
	}
}

func (r *thing) schemaType(ctx context.Context, s interface{ Type() attr.Type }) tftypes.Object {
	return s.Type().TerraformType(ctx).(tftypes.Object)
}

// save writes the planned object to its file; it is also what the state records.
func (r *thing) save(ctx context.Context, plan tfsdk.Plan, diags *diag.Diagnostics) string {
	var id string
	diags.Append(plan.GetAttribute(ctx, path.Root("id"), &id)...)
	if diags.HasError() {
		return ""
	}
	data, err := toJSON(plan.Raw, r.schemaType(ctx, plan.Schema))
	if err != nil {
		diags.AddError("testfw: encoding the object", err.Error())
		return ""
	}
	obj := data.(map[string]any)
	for _, name := range writeOnly {
		delete(obj, name)
	}
	if err := r.store.Save(id, obj); err != nil {
		diags.AddError("testfw: writing the remote object", err.Error())
	}
	return id
}

func (r *thing) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	id := r.save(ctx, req.Plan, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.State.Raw = req.Plan.Raw
	resp.Diagnostics.Append(resp.Private.SetKey(ctx, "reads", []byte("0"))...)
	resp.Diagnostics.Append(resp.Identity.Set(ctx, identityModel{ID: types.StringValue(id), Region: types.StringValue(region)})...)
}

func (r *thing) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	id := r.save(ctx, req.Plan, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.State.Raw = req.Plan.Raw
	resp.Diagnostics.Append(resp.Identity.Set(ctx, identityModel{ID: types.StringValue(id), Region: types.StringValue(region)})...)
}

func (r *thing) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var id string
	resp.Diagnostics.Append(req.State.GetAttribute(ctx, path.Root("id"), &id)...)
	if resp.Diagnostics.HasError() {
		return
	}
	obj, found, err := r.store.Load(id)
	if err != nil {
		resp.Diagnostics.AddError("testfw: reading the remote object", err.Error())
		return
	}
	if !found {
		// The framework wants an identity even for a removed object when none was stored yet.
		resp.Diagnostics.Append(resp.Identity.Set(ctx, identityModel{ID: types.StringValue(id), Region: types.StringValue(region)})...)
		resp.State.RemoveResource(ctx)
		return
	}
	for _, name := range writeOnly {
		delete(obj, name)
	}
	obj["id"] = id
	value, err := fromJSON(obj, r.schemaType(ctx, req.State.Schema))
	if err != nil {
		resp.Diagnostics.AddError("testfw: decoding "+r.store.Path(id), err.Error())
		return
	}
	resp.State.Raw = value

	reads := 0
	prior, diags := req.Private.GetKey(ctx, "reads")
	resp.Diagnostics.Append(diags...)
	if prior != nil {
		reads, _ = strconv.Atoi(string(prior))
	}
	resp.Diagnostics.Append(resp.Private.SetKey(ctx, "reads", []byte(strconv.Itoa(reads+1)))...)
	resp.Diagnostics.Append(resp.Identity.Set(ctx, identityModel{ID: types.StringValue(id), Region: types.StringValue(region)})...)
}

func (r *thing) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var id string
	resp.Diagnostics.Append(req.State.GetAttribute(ctx, path.Root("id"), &id)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := r.store.Delete(id); err != nil {
		resp.Diagnostics.AddError("testfw: deleting the remote object", err.Error())
	}
}

func (r *thing) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughWithIdentity(ctx, path.Root("id"), path.Root("id"), req, resp)
}

func (r *thing) UpgradeState(ctx context.Context) map[int64]resource.StateUpgrader {
	return map[int64]resource.StateUpgrader{
		0: {StateUpgrader: func(ctx context.Context, req resource.UpgradeStateRequest, resp *resource.UpgradeStateResponse) {
			var prior map[string]any
			if err := json.Unmarshal(req.RawState.JSON, &prior); err != nil {
				resp.Diagnostics.AddError("testfw: upgrading state v0", err.Error())
				return
			}
			prior["name"] = prior["title"]
			delete(prior, "title")
			typ := resp.State.Schema.Type().TerraformType(ctx).(tftypes.Object)
			value, err := fromJSON(prior, typ)
			if err != nil {
				resp.Diagnostics.AddError("testfw: upgrading state v0", err.Error())
				return
			}
			dv, err := tfprotov6.NewDynamicValue(typ, value)
			if err != nil {
				resp.Diagnostics.AddError("testfw: upgrading state v0", err.Error())
				return
			}
			resp.DynamicValue = &dv
		}},
	}
}

func (r *thing) UpgradeIdentity(ctx context.Context) map[int64]resource.IdentityUpgrader {
	return map[int64]resource.IdentityUpgrader{
		0: {IdentityUpgrader: func(ctx context.Context, req resource.UpgradeIdentityRequest, resp *resource.UpgradeIdentityResponse) {
			var prior struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(req.RawIdentity.JSON, &prior); err != nil || prior.Name == "" {
				resp.Diagnostics.AddError("testfw: upgrading identity v0", fmt.Sprintf("want {\"name\": ...}, got %s", req.RawIdentity.JSON))
				return
			}
			resp.Diagnostics.Append(resp.Identity.Set(ctx, identityModel{ID: types.StringValue(prior.Name), Region: types.StringValue(region)})...)
		}},
	}
}
