package dlpack

const sysProcessVMReadv = 270
