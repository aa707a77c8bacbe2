// Package sdk is the test provider built on terraform-plugin-sdk/v2 (protocol 5): one resource,
// testsdk_thing, with the shapes that SDK can express (it has no nested attributes and no dynamic
// type; its private state is the SDK's own, which records the schema version).
package sdk

import (
	"context"

	"github.com/hashicorp/terraform-plugin-go/tftypes"
	"github.com/hashicorp/terraform-plugin-sdk/v2/diag"
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"

	"kilolock.test/testprovider/remote"
)

// Address is the source address Terraform and kl know this build by.
const Address = "registry.terraform.io/kilolock/testsdk"

const region = "local"

// New is what plugin.Serve calls for each provider instance.
func New() *schema.Provider {
	return &schema.Provider{
		Schema: map[string]*schema.Schema{
			"dir":           {Type: schema.TypeString, Optional: true, Description: "Directory of the remote objects (default: $" + remote.EnvDir + ")."},
			"read_delay_ms": {Type: schema.TypeInt, Optional: true, Description: "Milliseconds each read sleeps (default: $" + remote.EnvReadDelay + ", else 0)."},
		},
		ResourcesMap:         map[string]*schema.Resource{"testsdk_thing": thing()},
		ConfigureContextFunc: configure,
	}
}

func configure(_ context.Context, d *schema.ResourceData) (any, diag.Diagnostics) {
	var delay *int64
	if v, ok := d.GetOk("read_delay_ms"); ok {
		ms := int64(v.(int))
		delay = &ms
	}
	store, err := remote.New(d.Get("dir").(string), delay)
	if err != nil {
		return nil, diag.FromErr(err)
	}
	return store, nil
}

// attributes is the schema of both versions; version 0 called "name" "title".
func attributes(nameKey string) map[string]*schema.Schema {
	return map[string]*schema.Schema{
		"key":         {Type: schema.TypeString, Required: true, ForceNew: true, Description: "Names the remote object: <dir>/<key>.json; also the id."},
		nameKey:       {Type: schema.TypeString, Optional: true},
		"size":        {Type: schema.TypeFloat, Optional: true},
		"tags":        {Type: schema.TypeMap, Optional: true, Elem: &schema.Schema{Type: schema.TypeString}},
		"labels":      {Type: schema.TypeList, Optional: true, Elem: &schema.Schema{Type: schema.TypeString}},
		"secret":      {Type: schema.TypeString, Optional: true, Sensitive: true},
		"password_wo": {Type: schema.TypeString, Optional: true, WriteOnly: true, Description: "Write-only (needs Terraform >= 1.11)."},
		"rule": {Type: schema.TypeList, Optional: true, Elem: &schema.Resource{Schema: map[string]*schema.Schema{
			"key":   {Type: schema.TypeString, Required: true},
			"value": {Type: schema.TypeString, Optional: true},
		}}},
		"member": {Type: schema.TypeSet, Optional: true, Elem: &schema.Resource{Schema: map[string]*schema.Schema{
			"name": {Type: schema.TypeString, Required: true},
			"role": {Type: schema.TypeString, Optional: true},
		}}},
	}
}

func thing() *schema.Resource {
	v0 := &schema.Resource{Schema: attributes("title")}
	return &schema.Resource{
		SchemaVersion: 1,
		Schema:        attributes("name"),
		CreateContext: create,
		ReadContext:   read,
		UpdateContext: update,
		DeleteContext: remove,
		Importer:      &schema.ResourceImporter{StateContext: schema.ImportStatePassthroughContext},
		StateUpgraders: []schema.StateUpgrader{{
			Version: 0,
			Type:    v0.CoreConfigSchema().ImpliedType(),
			Upgrade: func(_ context.Context, raw map[string]any, _ any) (map[string]any, error) {
				raw["name"] = raw["title"]
				delete(raw, "title")
				return raw, nil
			},
		}},
		Identity: &schema.ResourceIdentity{
			Version: 1,
			SchemaFunc: func() map[string]*schema.Schema {
				return map[string]*schema.Schema{
					"id":     {Type: schema.TypeString, RequiredForImport: true},
					"region": {Type: schema.TypeString, OptionalForImport: true},
				}
			},
			IdentityUpgraders: []schema.IdentityUpgrader{{
				Version: 0,
				Type:    tftypes.Object{AttributeTypes: map[string]tftypes.Type{"name": tftypes.String}},
				Upgrade: func(_ context.Context, raw map[string]any, _ any) (map[string]any, error) {
					return map[string]any{"id": raw["name"], "region": region}, nil
				},
			}},
		},
	}
}

func setIdentity(d *schema.ResourceData) diag.Diagnostics {
	identity, err := d.Identity()
	if err != nil {
		return diag.FromErr(err)
	}
	if err := identity.Set("id", d.Id()); err != nil {
		return diag.FromErr(err)
	}
	return diag.FromErr(identity.Set("region", region))
}

func save(d *schema.ResourceData, store *remote.Store) diag.Diagnostics {
	obj := map[string]any{}
	for name, s := range attributes("name") {
		if s.WriteOnly {
			continue
		}
		value := d.Get(name)
		if set, ok := value.(*schema.Set); ok {
			value = set.List()
		}
		obj[name] = value
	}
	return diag.FromErr(store.Save(d.Id(), obj))
}

func create(ctx context.Context, d *schema.ResourceData, meta any) diag.Diagnostics {
	d.SetId(d.Get("key").(string))
	if diags := save(d, meta.(*remote.Store)); diags.HasError() {
		return diags
	}
	return read(ctx, d, meta)
}

func update(ctx context.Context, d *schema.ResourceData, meta any) diag.Diagnostics {
	if diags := save(d, meta.(*remote.Store)); diags.HasError() {
		return diags
	}
	return read(ctx, d, meta)
}

func read(_ context.Context, d *schema.ResourceData, meta any) diag.Diagnostics {
	store := meta.(*remote.Store)
	obj, found, err := store.Load(d.Id())
	if err != nil {
		return diag.FromErr(err)
	}
	if !found {
		d.SetId("")
		return nil
	}
	for name, s := range attributes("name") {
		if s.WriteOnly {
			continue
		}
		value := obj[name]
		if n, ok := value.(interface{ Float64() (float64, error) }); ok {
			value, _ = n.Float64()
		}
		if err := d.Set(name, value); err != nil {
			return diag.Errorf("%s: attribute %q: %s", store.Path(d.Id()), name, err)
		}
	}
	if err := d.Set("key", d.Id()); err != nil {
		return diag.FromErr(err)
	}
	return setIdentity(d)
}

func remove(_ context.Context, d *schema.ResourceData, meta any) diag.Diagnostics {
	return diag.FromErr(meta.(*remote.Store).Delete(d.Id()))
}
