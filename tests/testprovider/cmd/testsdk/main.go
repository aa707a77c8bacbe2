// terraform-provider-testsdk: the terraform-plugin-sdk/v2 build (protocol 5).
package main

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/plugin"

	"kilolock.test/testprovider/sdk"
)

func main() {
	plugin.Serve(&plugin.ServeOpts{ProviderFunc: sdk.New, ProviderAddr: sdk.Address})
}
