// terraform-provider-testfw: the terraform-plugin-framework build (protocol 6).
package main

import (
	"context"
	"log"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"kilolock.test/testprovider/fw"
)

func main() {
	err := providerserver.Serve(context.Background(), fw.New, providerserver.ServeOpts{
		Address:         fw.Address,
		ProtocolVersion: 6,
	})
	if err != nil {
		log.Fatal(err)
	}
}
